"""The package asks torch for transparent huge pages before torch allocates (steer_ui/__init__.py): the decode
step streams the int8 unembedding from memory every token, and on 4 KiB pages it ran at half the speed."""
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")

# a fresh process: the package first, then a 64 MiB buffer written through, then what the kernel backs it with
PROBE = """
import steer_ui, torch, os
t = torch.empty(64 << 20, dtype=torch.uint8).fill_(1)
huge = [l for l in open('/proc/self/smaps_rollup') if l.startswith('AnonHugePages:')][0].split()[1]
print(os.environ.get('THP_MEM_ALLOC_ENABLE'), huge)
"""


def _probe(env: dict) -> tuple[str, int]:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout.split()
    return out[0], int(out[1])


def test_importing_the_package_first_gives_torchs_large_buffers_huge_pages():
    if not THP.is_file() or "[never]" in THP.read_text():
        pytest.skip("this kernel has transparent huge pages off (or none)")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    setting, huge_kb = _probe(env)
    assert setting == "1" and huge_kb >= 32 << 10, (setting, huge_kb)


def test_a_setting_made_before_the_import_is_kept():
    """An operator's own choice (0 turns it off) wins over the package's default."""
    if not THP.is_file() or "[madvise]" not in THP.read_text():
        pytest.skip("only where huge pages are given on request ('madvise') does torch's setting decide")
    setting, huge_kb = _probe({**os.environ, "THP_MEM_ALLOC_ENABLE": "0"})
    assert setting == "0" and huge_kb < 32 << 10, (setting, huge_kb)


def test_packed_weights_sit_side_by_side_on_huge_pages_whatever_was_imported_first():
    """Packed int8 weights (huge_pages.empty): small ones share an arena in the order they are packed (a step reads
    them in that order), each buffer on a cache line, a large one alone from a huge page's start; the kernel is
    asked for huge pages even where torch was not (this process imported torch before the package)."""
    import torch

    from steer_ui.model import huge_pages

    small = [huge_pages.empty((3, 5, 64), torch.int8) for _ in range(3)]
    scale = huge_pages.empty((3, 5, 16), torch.float32)
    ends = [t.data_ptr() + t.numel() * t.element_size() for t in small]
    assert all(t.data_ptr() % huge_pages.ALIGN == 0 for t in [*small, scale])
    assert small[1].data_ptr() == -(-ends[0] // 64) * 64 and small[2].data_ptr() == -(-ends[1] // 64) * 64
    assert scale.dtype == torch.float32 and scale.shape == (3, 5, 16)
    big = huge_pages.empty((huge_pages.ARENA // 64 + 1, 64), torch.int8)
    assert big.data_ptr() % huge_pages.HUGE == 0
    if not THP.is_file() or "[never]" in THP.read_text():
        pytest.skip("this kernel has transparent huge pages off (or none)")
    # torch told not to (the operator's 0): the package's own request still gives the buffer huge pages
    probe = ("import torch\nfrom steer_ui.model import huge_pages\n"
             "big = huge_pages.empty((64 << 20,), torch.int8)\nbig.fill_(1)\nprint(huge_pages.huge_kb(big))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**os.environ, "THP_MEM_ALLOC_ENABLE": "0"},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert int(out) >= 60 << 10, out


def test_the_switch_leaves_huge_pages_off_for_the_package_and_torch():
    """``STEER_UI_HUGE_PAGES=0``: no madvise of the package's, and torch is not told to ask (the A side of the
    before-and-after in docs/bench.md)."""
    if not THP.is_file() or "[madvise]" not in THP.read_text():
        pytest.skip("only where huge pages are given on request ('madvise') does asking decide")
    env = {k: v for k, v in os.environ.items() if k != "THP_MEM_ALLOC_ENABLE"}
    setting, huge_kb = _probe({**env, "STEER_UI_HUGE_PAGES": "0"})
    assert setting == "None" and huge_kb < 32 << 10, (setting, huge_kb)
    probe = ("import torch\nfrom steer_ui.model import huge_pages\n"
             "big = huge_pages.empty((64 << 20,), torch.int8)\nbig.fill_(1)\nprint(huge_pages.huge_kb(big))")
    out = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, env={**env, "STEER_UI_HUGE_PAGES": "0"},
                         capture_output=True, text=True, timeout=120, check=True).stdout
    assert int(out) < 32 << 10, out
