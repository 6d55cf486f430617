"""An attacker's probe of the state the kernel shares between sandboxes: code that runs inside a sandbox, as a
patch's code would (`python - ARGS` with this text on stdin), and tries to leave 16 bits for a later or a concurrent
sandbox of the same task to read, one channel class at a time.

    python - write pagecache SALT BITS      set the residency of 16 shared files' first pages (1: read it, 0: evict
                                            it with posix_fadvise)
    python - read pagecache SALT            recover them, by every reader that works: timing a read (a page not in
                                            the cache costs a disk read), preadv's RWF_NOWAIT (fails on a page not in
                                            the cache) and fault counting (a mapped page's first touch is a major
                                            fault, counted by getrusage, when it was not in the cache)
    python - write flock SALT BITS SECS     hold an exclusive flock on the shared files of the 1 bits until
                                            the scratch file `stop` exists (at most SECS)
    python - read flock SALT                a non-blocking flock on each file: refused = 1
    python - write lockf SALT BITS SECS     hold a POSIX read lock (fcntl F_SETLK) on the files of the 1 bits
    python - read lockf SALT                fcntl F_GETLK asks who would stop a write lock: someone = 1
    python - read inotify SALT SECS         watch the 16 files (inotify, through ctypes) for SECS: opened = 1
    python - write inotify SALT BITS        open the files of the 1 bits
    python - evict pagecache SALT           (the test's own, on the host: the sandbox refuses it) drop the files'
                                            pages from the cache, so a reader finds cold what no sandbox read
    python - read meminfo                   the memory statistics a sandbox can read: /proc/meminfo's Shmem, MemFree
                                            and MemAvailable, sysinfo's free RAM (os.sysconf), in kB, /proc/vmstat's
                                            nr_free_pages, node 0's MemFree (/sys), the dentry count
                                            (/proc/sys/fs/dentry-state), one a line ('?': unreadable or empty)
    python - write activity KIND BITS T0 SLOT  between two concurrent sandboxes, by the shared clock: in slot i
                                            (SLOT seconds from T0 + i * SLOT) be busy if bit i is 1, idle if 0;
                                            KIND cpu (two processes spin), disk (write and fsync 1 MiB at a time
                                            in the working folder), space (64 MiB of files there, kept to the end)
                                            or fork (start processes)
    python - read activity T0 SLOT          meanwhile, how each machine-wide activity counter the sandbox can read
                                            moved in each slot, split at the median (more activity = 1): one line
                                            per counter (/proc/stat's CPU times, context switches, forks, interrupts
                                            and running processes, /proc/loadavg, /proc/uptime's idle time,
                                            /proc/diskstats, /sys/block/*/stat, the per-CPU idle times under
                                            /sys/devices/system/cpu, /proc/interrupts, /proc/softirqs,
                                            /proc/schedstat), '?' x 16 where it cannot be read or never moved,
                                            own_speed: how much fixed work the reader itself got done (plain
                                            timing, which no view hides), and own_wait: how long the reader
                                            waited for its CPU (/proc/self/schedstat: other processes ran there)
    python - write space MB                 write MB MiB (new files of 16 MiB, kept) into each place a test run may
                                            write: the working folder, /tmp, $HOME, /var/tmp, and / itself, then
                                            sync; prints `written` and the MiB each place took
    python - clear space                    remove what `write space` wrote, then sync
    python - read space                     the free bytes of every file system the sandbox sees (statvfs of each
                                            mount point of /proc/self/mountinfo), one `space PATH BYTES` a line
    python - read machine SHOWN PATH...     how many bytes each /proc PATH (a file, or a folder's files) gives by
                                            each route to it (its path, /proc/self/.., /proc/thread-self/.., openat
                                            on a /proc descriptor; 'refused' if none), every file of the machine's
                                            memory statistics, the CPUs' idle times and the disks' counters under
                                            /sys that reads non-empty, every entry of /sys (6 levels deep) beside
                                            the ':'-separated SHOWN paths that is not empty (a folder with entries,
                                            a file with text), and the memory limit of the cgroup /sys/fs/cgroup
                                            shows

The activity reader also reads the free space of "/" (`statfs_root`) and of every other mount point together
(`statfs_mounts`), which `space` moves where the sandboxes share a file system.

The files (16 per reader) are picked by SALT among the shared read-only files both sandboxes see (regular files of
at least 64 KiB under /usr/bin and /usr/lib/<arch>-linux-gnu, sorted), so a test picks fresh, cold files each run.
A reader prints one line per reader: its name and 16 characters, each '0', '1', or '?' where the reader failed (the
call refused). A writer writes a file `ready` into the scratch folder once its bits are set (the test waits for it),
and prints `written` with what it could not do.
"""

import subprocess
import sys

PROBE = r'''
import ctypes, errno, fcntl, glob, mmap, os, random, resource, struct, sys, time

PAGE = mmap.PAGESIZE


def files(salt):
    found = []
    for top in sorted(["/usr/bin", *glob.glob("/usr/lib/*-linux-gnu")]):
        for root, dirs, names in os.walk(top):
            dirs.sort()
            for name in sorted(names):
                path = os.path.join(root, name)
                try:
                    if not os.path.islink(path) and os.path.getsize(path) >= 65536 and os.access(path, os.R_OK):
                        found.append(path)
                except OSError:
                    pass
    return random.Random(salt).sample(found, 32)


def ready():
    open("/tmp/swegym/ready", "w").close()


def write_pagecache(paths, bits):
    refused = set()
    for path, bit in zip(paths, bits):
        fd = os.open(path, os.O_RDONLY)
        try:
            if bit == "1":
                os.read(fd, 65536)
            else:
                try:
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                except OSError as e:
                    refused.add("fadvise:" + errno.errorcode[e.errno])
        finally:
            os.close(fd)
    return refused


def per_file(paths, probe, blocked):
    """One character per file: what `probe(fd)` returns, `blocked` where it raised BlockingIOError, '?' where the
    call was refused (another OSError)."""
    out = ""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            out += probe(fd)
        except BlockingIOError:
            out += blocked
        except OSError:
            out += "?"
        finally:
            os.close(fd)
    return out


def read_nowait(paths):  # a page not in the cache: EAGAIN
    return per_file(paths, lambda fd: os.preadv(fd, [bytearray(PAGE)], 0, os.RWF_NOWAIT) and "1", "0")


def read_timing(paths):
    """How long reading each file's first 16 pages takes (a cold page costs a disk read): the 16 times split at
    their widest gap (the largest ratio between neighbours once sorted), fast = 1."""
    times = []
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            started = time.perf_counter_ns()
            os.pread(fd, 16 * PAGE, 0)
            times.append(time.perf_counter_ns() - started)
        finally:
            os.close(fd)
    ranked = sorted(times)
    gap = max(range(1, len(ranked)), key=lambda i: ranked[i] / max(ranked[i - 1], 1))
    return "".join("1" if t < ranked[gap] else "0" for t in times)


def read_faults(paths):
    out = ""
    for path in paths:
        with open(path, "rb") as f:
            try:
                m = mmap.mmap(f.fileno(), PAGE, prot=mmap.PROT_READ)
            except OSError:
                out += "?"
                continue
            before = resource.getrusage(resource.RUSAGE_SELF).ru_majflt
            m[0]
            out += "0" if resource.getrusage(resource.RUSAGE_SELF).ru_majflt > before else "1"
            m.close()
    return out


def hold(fds, seconds):
    ready()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not os.path.exists("/tmp/swegym/stop"):
        time.sleep(0.05)
    for fd in fds:
        os.close(fd)


FLOCK = "hhxxxxqqixxxx"  # struct flock on 64-bit Linux: type, whence, start, len, pid
LOCKS = {
    "flock": lambda fd: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB),
    "lockf": lambda fd: fcntl.fcntl(fd, fcntl.F_SETLK, struct.pack(FLOCK, fcntl.F_RDLCK, 0, 0, 0, 0)),
}


def write_lock(channel, paths, bits, seconds):
    fds, refused = [], set()
    for path, bit in zip(paths, bits):
        if bit == "1":
            fd = os.open(path, os.O_RDONLY)
            try:
                LOCKS[channel](fd)
            except OSError as e:
                refused.add(channel + ":" + errno.errorcode[e.errno])
            fds.append(fd)
    print("written", *sorted(refused), flush=True)
    hold(fds, seconds)


def read_flock(paths):  # held elsewhere: EWOULDBLOCK
    return per_file(paths, lambda fd: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB) or "0", "1")


def read_lockf(paths):  # F_GETLK names a lock that would stop a write lock
    def held(fd):
        got = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(FLOCK, fcntl.F_WRLCK, 0, 0, 0, 0))
        return "0" if struct.unpack(FLOCK, got)[0] == fcntl.F_UNLCK else "1"

    return per_file(paths, held, "?")


def read_proc_locks(paths):
    try:
        text = open("/proc/locks").read()
    except OSError:
        return "?" * 16
    held = {line.split()[5].rsplit(":", 1)[1] for line in text.splitlines() if len(line.split()) > 5}
    return "".join("1" if str(os.stat(p).st_ino) in held else "0" for p in paths)


def read_inotify(paths, seconds):
    libc = ctypes.CDLL(None, use_errno=True)
    fd = libc.inotify_init1(os.O_NONBLOCK)
    if fd < 0:
        ready()
        return "?" * 16
    watches = {libc.inotify_add_watch(fd, p.encode(), 0x20 | 0x1): i for i, p in enumerate(paths)}  # OPEN|ACCESS
    ready()
    seen = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            data = os.read(fd, 65536)
        except BlockingIOError:
            time.sleep(0.05)
            continue
        while data:
            wd, mask, cookie, length = struct.unpack("iIII", data[:16])
            seen.add(watches.get(wd))
            data = data[16 + length:]
    return "".join("1" if i in seen else "0" for i in range(16))


def write_inotify(paths, bits):
    for path, bit in zip(paths, bits):
        if bit == "1":
            with open(path, "rb") as f:
                f.read(1)
    print("written", flush=True)


def fields(path):
    """{first word: second word} of each line of `path` ({} where it cannot be read)."""
    try:
        with open(path) as f:
            return dict(line.replace(":", " ").split()[:2] for line in f if len(line.split()) > 1)
    except OSError:
        return {}


def meminfo():
    mine = fields("/proc/meminfo")
    for key in ("Shmem", "MemFree", "MemAvailable"):
        print(key, mine.get(key, "?"))
    try:
        print("sysinfo", os.sysconf("SC_AVPHYS_PAGES") * PAGE // 1024)
    except (OSError, ValueError):
        print("sysinfo ?")
    print("vmstat", fields("/proc/vmstat").get("nr_free_pages", "?"))
    node = dict(line.replace(":", " ").split()[2:4] for line in open_lines("/sys/devices/system/node/node0/meminfo"))
    print("node0", node.get("MemFree", "?"))
    print("dentries", (open_lines("/proc/sys/fs/dentry-state") or ["?"])[0].split()[0])


def open_lines(path):
    try:
        with open(path) as f:
            return f.read().splitlines()
    except OSError:
        return []


def size(path, dir_fd=None):
    """Bytes read from the file `path`, or from every file of the folder `path`; None where it cannot be read."""
    try:
        fd = os.open(path, os.O_RDONLY, dir_fd=dir_fd)
    except OSError:
        return None
    try:
        if not os.path.isdir(f"/proc/self/fd/{fd}"):
            return len(os.read(fd, 1 << 20))
        return sum(size(name, dir_fd=fd) or 0 for name in os.listdir(fd))
    finally:
        os.close(fd)


def machine(shown, paths):
    proc = os.open("/proc", os.O_RDONLY | os.O_DIRECTORY)
    for path in paths:
        name = path[len("/proc/"):]
        routes = {"path": size(path), "self": size("/proc/self/../" + name),
                  "thread-self": size("/proc/thread-self/../../../" + name), "dirfd": size(name, dir_fd=proc)}
        for route, got in routes.items():
            print("proc", route, path, "refused" if got is None else got)
    patterns = ["/sys/devices/system/node/node*/*", "/sys/bus/node/devices/*/*", "/sys/kernel/mm/*/*",
                "/sys/kernel/mm/*/*/*", "/sys/kernel/slab/*/objects", "/sys/devices/system/cpu/cpu*/cpuidle/*/*",
                "/sys/block/*/stat"]
    for found in sorted({p for pattern in patterns for p in glob.glob(pattern)}):
        if os.path.isfile(found) and size(found):
            print("sys_readable", found)
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):  # v2, v1
        if os.path.exists(limit):
            print("cgroup_limit", (open_lines(limit) or ["?"])[0])
    for root, dirs, names in os.walk("/sys"):
        if root.count("/") >= 6:
            dirs.clear()
        for entry in dirs + names:
            path = os.path.join(root, entry)
            if any(path == s or path.startswith(s + "/") or s.startswith(path + "/") for s in shown):
                continue
            try:  # a masked folder is an empty tmpfs, a masked file /dev/null
                empty = not os.listdir(path) if os.path.isdir(path) and not os.path.islink(path) else not size(path)
            except OSError:
                empty = True
            if not empty:
                print("sys_visible", path)


SPACE_PLACES = (".", "/tmp", os.path.expanduser("~"), "/var/tmp", "/")
SPACE_FILE = "trl-multiturn-space"


def write_space(megabytes):
    """Write `megabytes` MiB into each of SPACE_PLACES that takes it, 16 MiB a file (under RLIMIT_FSIZE)."""
    chunk, took = b"x" * (16 << 20), {}
    for place in SPACE_PLACES:
        took[place] = 0
        for i in range(megabytes // 16):
            try:
                with open(os.path.join(place, f"{SPACE_FILE}-{i}"), "wb") as f:
                    f.write(chunk)
                    os.fsync(f.fileno())
            except OSError:
                break
            took[place] += 16
    os.sync()  # the file systems' books brought up to date (btrfs counts its blocks used when it commits)
    print("written", *(f"{place}={mb}" for place, mb in took.items()), flush=True)


def clear_space():
    for place in SPACE_PLACES:
        for leftover in glob.glob(os.path.join(place, SPACE_FILE + "-*")):
            os.unlink(leftover)
    os.sync()
    print("cleared")


def mount_points():
    with open("/proc/self/mountinfo") as f:
        return sorted({line.split()[4].replace("\\040", " ") for line in f})


def free_bytes(path):
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bfree * stats.f_frsize


def numbers(text):
    return [int(word) for word in text.split() if word.isdigit()]


def stat_field(lines, key):
    row = next((line.split() for line in lines if line.split()[:1] == [key]), None)
    return int(row[1]) if row else None


def counters():
    """{counter: one number that grows with the machine's activity}; None where unreadable (an empty file too)."""
    stat, found = open_lines("/proc/stat"), {}
    cpu = next((numbers(line) for line in stat if line.startswith("cpu ")), None)
    found["stat_busy"] = sum(cpu) - cpu[3] - cpu[4] if cpu else None  # all but idle and iowait
    found["stat_idle"] = -sum(numbers(line)[3] for line in stat if line.startswith("cpu") and line[3:4].isdigit()
                              ) if cpu else None  # the per-CPU idle times, less idle = more activity
    for key in ("ctxt", "processes", "intr", "procs_running"):
        found["stat_" + key] = stat_field(stat, key)
    load = (open_lines("/proc/loadavg") or [""])[0].split()
    found["loadavg"] = round(float(load[0]) * 100) if load else None
    found["loadavg_running"] = int(load[3].split("/")[0]) if load else None
    uptime = (open_lines("/proc/uptime") or [""])[0].split()
    found["uptime_idle"] = -round(float(uptime[1]) * 100) if uptime else None
    disks = [line.split() for line in open_lines("/proc/diskstats")]
    found["diskstats"] = sum(int(d[5]) + int(d[9]) for d in disks if len(d) > 9) if disks else None  # sectors
    blocks = [open_lines(path) for path in glob.glob("/sys/block/*/stat")]
    found["sys_block"] = sum(int(b[0].split()[2]) + int(b[0].split()[6]) for b in blocks if b) if any(blocks) else None
    for name in ("interrupts", "softirqs"):
        rows = open_lines(f"/proc/{name}")[1:]
        found[name] = sum(sum(numbers(line.split(":", 1)[1])[:64]) for line in rows if ":" in line) if rows else None
    idle = [open_lines(path) for path in glob.glob("/sys/devices/system/cpu/cpu*/cpuidle/state*/time")]
    found["sys_cpuidle"] = -sum(int(t[0]) for t in idle if t) if any(idle) else None  # per-CPU idle times, in us
    sched = [line.split() for line in open_lines("/proc/schedstat") if line.startswith("cpu")]
    found["schedstat"] = sum(int(c[7]) for c in sched if len(c) > 7) if sched else None  # ns spent running
    own = open_lines("/proc/self/schedstat")  # this process's own: ns it ran, ns it waited for a CPU, time slices
    found["own_wait"] = int(own[0].split()[1]) if own else None
    root = free_bytes("/")
    found["statfs_root"] = -root if root is not None else None  # less free space = more activity
    found["statfs_mounts"] = -sum(free_bytes(p) or 0 for p in mount_points() if p != "/")
    return found


INSTANT = ("stat_procs_running", "loadavg_running")  # how many run now: summed over samples, not differenced


def wait_until(moment):
    while (left := moment - time.time()) > 0:
        time.sleep(min(left, 0.05))


def write_activity(kind, bits, start, slot):
    spinners = 2 if kind == "cpu" else 1
    for worker in range(spinners - 1):
        if os.fork() == 0:
            break
    else:
        worker = spinners - 1
    chunk = os.urandom(1 << 20)
    for i, bit in enumerate(bits):
        end = start + (i + 1) * slot
        wait_until(start + i * slot)
        for _ in range(4 if kind == "space" and bit == "1" else 0):  # 64 MiB a slot, kept
            with open(f"activity-{os.getpid()}-{i}-{_}", "wb") as f:
                f.write(chunk * 16)
                os.fsync(f.fileno())
        if kind == "space" and bit == "1":
            os.sync()
        while bit == "1" and kind != "space" and time.time() < end:
            if kind == "disk":
                with open(f"activity-{os.getpid()}", "wb") as f:
                    f.write(chunk)
                    os.fsync(f.fileno())
            elif kind == "fork":
                pid = os.fork()
                if pid == 0:
                    os._exit(0)
                os.waitpid(pid, 0)
    if worker != spinners - 1:
        os._exit(0)
    if spinners > 1:
        os.wait()
    for leftover in glob.glob("activity-*"):
        os.unlink(leftover)
    print("written", flush=True)


def read_activity(start, slot):
    moves = {}
    for i in range(16):
        begin = start + i * slot
        wait_until(begin + 0.1 * slot)
        before, instant, samples = counters(), dict.fromkeys(INSTANT, 0), 0
        while time.time() < begin + 0.9 * slot:
            now = counters()
            for name in INSTANT:
                instant[name] += now[name] or 0
            samples += 1
            sum(range(20000))  # a fixed piece of work: fewer of them done in the slot = more activity elsewhere
        instant = {name: total / samples for name, total in instant.items()}  # how many ran, on average
        instant["own_speed"] = -samples
        after = {**counters(), "own_speed": 0}
        for name, value in after.items():
            moved = instant[name] if name in instant else (
                None if value is None or before[name] is None else value - before[name])
            moves.setdefault(name, []).append(moved)
    for name, values in moves.items():
        if None in values or len(set(values)) == 1:
            print(name, "?" * 16)
            continue
        middle = sorted(values)[7:9]  # about half the bits are 1: above the median = 1
        print(name, "".join("1" if 2 * v > sum(middle) else "0" for v in values))


action, channel = sys.argv[1:3]
if channel == "activity":
    if action == "write":
        write_activity(sys.argv[3], sys.argv[4], float(sys.argv[5]), float(sys.argv[6]))
    else:
        read_activity(float(sys.argv[3]), float(sys.argv[4]))
    sys.exit()
if channel == "meminfo":
    meminfo()
    sys.exit()
if channel == "space":
    if action == "write":
        write_space(int(sys.argv[3]))
    elif action == "clear":
        clear_space()
    else:
        for point in mount_points():
            print("space", point, free_bytes(point))
    sys.exit()
if channel == "machine":
    machine(sys.argv[3].split(":"), sys.argv[4:])
    sys.exit()
paths = files(sys.argv[3])
paths = paths if channel == "pagecache" else paths[:16]
if action == "evict":
    print("evicted", *sorted(write_pagecache(paths, "0" * 32)), flush=True)
elif action == "write" and channel == "pagecache":
    print("written", *sorted(write_pagecache(paths, sys.argv[4] * 2)), flush=True)
    ready()
elif action == "write" and channel in LOCKS:
    write_lock(channel, paths, sys.argv[4], float(sys.argv[5]))
elif action == "write" and channel == "inotify":
    write_inotify(paths, sys.argv[4])
elif channel == "pagecache":
    print("timing", read_timing(paths[:16]))  # before the no-wait reader, whose refusal or EAGAIN may read ahead
    print("nowait", read_nowait(paths[:16]))  # apart: a RWF_NOWAIT read that fails starts the page's readahead
    print("faults", read_faults(paths[16:]))
elif channel == "flock":
    print("flock", read_flock(paths))
elif channel == "lockf":
    print("lockf", read_lockf(paths))
    print("proc_locks", read_proc_locks(paths))
elif channel == "inotify":
    print("inotify", read_inotify(paths, float(sys.argv[4])))
'''


def evict_on_host(salt: int) -> None:
    """Drop from the page cache the host's files that the probe picks by `salt` (as the host sees them), so that the
    only pages of them a reader finds cached are those a sandbox read."""
    done = subprocess.run([sys.executable, "-", "evict", "pagecache", str(salt)], input=PROBE, text=True,
                          capture_output=True)
    assert done.returncode == 0 and done.stdout.split() == ["evicted"], done.stdout + done.stderr


def command(*args: object) -> str:
    """The sandbox command that runs the probe with `args`."""
    return "python - " + " ".join(str(a) for a in args) + f" <<'EOF'\n{PROBE}\nEOF"


def readers(output: str) -> dict[str, str]:
    """A reader's output as {reader: 16 characters of '0', '1', '?'}."""
    return {line.split()[0]: line.split()[1] for line in output.splitlines() if len(line.split()) == 2}


def matching(bits: str, read: str) -> int:
    """How many of the 16 bits `read` recovered (a '?' recovers none)."""
    return sum(a == b for a, b in zip(bits, read))
