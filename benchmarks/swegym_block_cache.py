"""Whether a cache below the kernel's page cache keeps the blocks of this machine's disk that were read: the cache
that the Docker sandbox's containers share, since their files' blocks are their image's (`sandbox/residency.py`).

    python benchmarks/swegym_block_cache.py PATH [--reads 100] [--passes 3]   # as root for the tests' engine image

Reads `--reads` random 64 KiB ranges of PATH's data (holes skipped) with direct I/O, which no page cache of this
kernel serves, `--passes` times over in the same order, and prints the median, 10th and 90th percentile time of a
read per pass. A first pass slower than the next ones is a cache below the kernel (on a virtual machine, the
hypervisor's cache of its disk) that a first read filled. The first pass is cold only on blocks nobody read lately:
give it a file nothing reads (the Docker engine's disk image, `/var/lib/trl-multiturn-docker/btrfs.img` for the
tests' engine, after hours of no grading; a file just written is cached already).
"""

from __future__ import annotations

import argparse
import mmap
import os
import random
import time

CHUNK = 64 << 10


def data_ranges(fd: int) -> list[tuple[int, int]]:
    """The (start, end) byte ranges of the file's data, holes left out."""
    ranges, offset, size = [], 0, os.fstat(fd).st_size
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError:  # ENXIO: no data after offset
            break
        offset = os.lseek(fd, start, os.SEEK_HOLE)
        ranges.append((start, offset))
    return ranges


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("path")
    parser.add_argument("--reads", type=int, default=100)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    fd = os.open(args.path, os.O_RDONLY | os.O_DIRECT)
    ranges = [(start, end) for start, end in data_ranges(fd) if end - start >= 2 * CHUNK]
    if not ranges:
        raise SystemExit(f"{args.path}: no data range of at least {2 * CHUNK} bytes")
    rng = random.Random()
    offsets = []
    for _ in range(args.reads):
        start, end = rng.choice(ranges)
        offsets.append(rng.randrange(start // CHUNK + 1, end // CHUNK) * CHUNK - CHUNK)
    buffer = mmap.mmap(-1, CHUNK)  # page-aligned, as direct I/O needs
    for number in range(args.passes):
        times = []
        for offset in offsets:
            started = time.perf_counter_ns()
            os.preadv(fd, [buffer], offset)
            times.append((time.perf_counter_ns() - started) / 1000)
        times.sort()
        print(f"pass {number + 1}: median {times[len(times) // 2]:.0f} us, 10th percentile "
              f"{times[len(times) // 10]:.0f} us, 90th {times[len(times) * 9 // 10]:.0f} us")
    os.close(fd)


if __name__ == "__main__":
    main()
