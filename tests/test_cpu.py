"""MKL code-path tuning: chosen only for non-Intel x86 CPUs with MKL, never over the user's own setting, applied by
the command line only."""

from __future__ import annotations

import os

import pytest
import torch

from hf_jetspec import cli, cpu

needs_mkl = pytest.mark.skipif(not torch.backends.mkl.is_available(), reason="PyTorch without MKL")


@needs_mkl
def test_code_path_is_the_isa_on_non_intel_cpus_only():
    assert cpu.mkl_code_path("AuthenticAMD", "AVX512") == "AVX512"
    assert cpu.mkl_code_path("AuthenticAMD", "AVX2") == "AVX2"
    assert cpu.mkl_code_path("HygonGenuine", "AVX2") == "AVX2"
    assert cpu.mkl_code_path("AuthenticAMD", "DEFAULT") is None  # no vector ISA MKL_CBWR names
    assert cpu.mkl_code_path("GenuineIntel", "AVX512") is None  # MKL picks its own kernels there


def test_without_mkl_nothing_is_chosen(monkeypatch):
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    assert cpu.mkl_code_path("AuthenticAMD", "AVX512") is None


def test_vendor_is_read_from_cpuinfo():
    vendor = cpu.cpu_vendor()
    info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    if "vendor_id" in info:
        assert vendor and vendor in info
    else:
        assert vendor is None


def test_tune_respects_the_users_setting(monkeypatch):
    monkeypatch.setattr(cpu, "mkl_code_path", lambda: "AVX2")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    assert cpu.tune_mkl() == "COMPATIBLE" and os.environ["MKL_CBWR"] == "COMPATIBLE"
    monkeypatch.setenv("MKL_CBWR", "")
    assert cpu.tune_mkl() == "AVX2" and os.environ["MKL_CBWR"] == "AVX2"
    monkeypatch.setenv("MKL_CBWR", "")
    monkeypatch.setattr(cpu, "mkl_code_path", lambda: None)
    assert cpu.tune_mkl() is None and os.environ["MKL_CBWR"] == ""


def test_only_the_command_line_tunes(monkeypatch, capsys):
    """`hf-jetspec ...` (main() reading sys.argv) sets MKL_CBWR; in-process calls with argv leave it alone."""
    monkeypatch.setattr(cpu, "mkl_code_path", lambda: "AVX2")
    monkeypatch.setenv("MKL_CBWR", "")
    monkeypatch.setattr(cli, "cmd_convert", lambda args: 0)  # a command that runs without a model
    assert cli.main(["convert-gguf", "model.gguf"]) == 0
    assert os.environ["MKL_CBWR"] == ""
    monkeypatch.setattr("sys.argv", ["hf-jetspec", "convert-gguf", "model.gguf"])
    assert cli.main() == 0
    assert os.environ["MKL_CBWR"] == "AVX2"
