#!/bin/bash
# The whole-store continuation at a quarter of the learning rate: final.sh with these flags.
NAME=lowlr "$(dirname "$0")/final.sh" --lr 5e-5 --max-steps 300 --eval-steps 150 --eval-decode-count 0
