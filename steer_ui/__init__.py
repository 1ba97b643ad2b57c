import os

# Huge pages for torch's large CPU buffers (its allocator aligns allocations of 2 MiB and more and asks the kernel
# for transparent huge pages where they are "madvise"-only, as on Debian).  The decode step streams the int8
# weights (270 MB for the embedded Gemma 3, 168 MB of them the unembedding) from memory every token; on 4 KiB
# pages the hardware prefetchers stop at each page's end (docs/bench.md, "Huge pages").  torch reads the
# variable once, at its first allocation, so it is set here, before the package imports torch; a process that
# imported torch first keeps what it had (the packed weights still get huge pages: model/huge_pages.py).
# STEER_UI_HUGE_PAGES=0 leaves both off.
if os.environ.get("STEER_UI_HUGE_PAGES") != "0":
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
