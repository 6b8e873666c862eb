# bench/io_reference.py — the I/O reference the benches put beside a run: fio (huge-page buffers,
# O_DIRECT, io_uring, 1 MiB blocks, QD 8) reading and writing files on the same drive at given
# rates while the run goes on. On a VM whose disk the host emulates (this dev box), every byte
# moved costs CPU the kernels would have had, whoever moves it; a resident run beside fio at an
# offloaded run's rates is the ceiling offloading can reach at that traffic on that machine.
#
#     with FioTraffic(folder, read_bytes_per_s, write_bytes_per_s) as fio:
#         run_something()
#     fio.reached   # (read, write) bytes/s fio measured
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time


def require_fio(flag):
    if shutil.which("fio") is None:
        raise SystemExit(f"{flag} needs fio (scripts/setup.sh installs it)")


HUGE_PAGES = "/proc/sys/vm/nr_hugepages"


def huge_pages_for_fio(pages):
    """fio's buffers in 2 MiB pages, as strata's arena has them (a 1 MiB request in 4 KiB pages is
    two on this virtio queue). Reserves them when root; otherwise says fio runs on plain pages.
    Returns (fio's iomem, the reservation to restore afterwards or None)."""
    try:
        with open(HUGE_PAGES) as f:
            before = have = int(f.read())
        if have < pages:
            with open(HUGE_PAGES, "w") as f:
                f.write(str(pages))
            with open(HUGE_PAGES) as f:  # the kernel grants what it can find, maybe fewer
                have = int(f.read())
    except OSError as error:
        print(f"note: fio on 4 KiB pages ({HUGE_PAGES}: {error.strerror})")
        return "malloc", None
    restore = before if have != before else None
    if have < pages:
        print(f"note: fio on 4 KiB pages (only {have} of {pages} huge pages could be reserved)")
        return "malloc", restore
    return "shmhuge", restore


def restore_huge_pages(count):
    if count is not None:
        with open(HUGE_PAGES, "w") as f:
            f.write(str(count))


UNLIMITED = float("inf")


class FioTraffic:
    """fio streaming at the given rates (bytes/s; 0 leaves that direction out, UNLIMITED reads or
    writes as fast as the drive goes) in a scratch folder under `root` for as long as the `with`
    block runs — or, with `window_s` = (delay, length), measuring only that window of it, from
    `delay` seconds after the block starts; `reached` holds the rates fio measured."""

    def __init__(self, root, read_bytes_per_s, write_bytes_per_s, window_s=None):
        self.root = root
        self.rates = {"read": read_bytes_per_s, "write": write_bytes_per_s}
        self.window_s = window_s
        self.reached = None

    def __enter__(self):
        self.folder = tempfile.mkdtemp(prefix="fio-", dir=self.root)
        job = os.path.join(self.folder, "traffic.fio")
        delay_s, length_s = self.window_s or (0, 3600)
        iomem, self.restore_pages = huge_pages_for_fio(64)
        with open(job, "w") as f:
            f.write(f"[global]\nioengine=io_uring\ndirect=1\nbs=1M\niodepth=8\n"
                    f"iomem={iomem}\ntime_based=1\nruntime={length_s}\n"
                    f"directory={self.folder}\nsize=256m\n")
            for name, rate in self.rates.items():
                if rate > 0:
                    limit = "" if rate == UNLIMITED else f"rate={int(rate)}\n"
                    # fio's clock starts at launch; the block starts after the 3 s below.
                    start = f"startdelay={3 + delay_s}\n" if self.window_s else ""
                    f.write(f"[{name}]\nrw={name}\n{limit}filename={name}.bin\n{start}")
        self.fio = subprocess.Popen(["fio", job, "--output-format=json"], stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True)
        time.sleep(3)  # fio lays its files out first; then the streams run at their rates
        if self.fio.poll() is not None:
            error = self.fio.stderr.read().strip()
            shutil.rmtree(self.folder)
            restore_huge_pages(self.restore_pages)
            raise SystemExit(f"fio stopped before the run: {error}")
        return self

    def __exit__(self, *exc):
        if self.window_s is None:
            self.fio.send_signal(signal.SIGINT)
        out, err = self.fio.communicate(timeout=60 + sum(self.window_s or (0, 0)))
        shutil.rmtree(self.folder)
        restore_huge_pages(self.restore_pages)  # the machine as it was
        if exc[0] is not None:
            return False
        try:
            jobs = {j["jobname"]: j for j in json.loads(out[out.index("{"):])["jobs"]}
            self.reached = tuple(jobs[name][name]["bw_bytes"] if name in jobs else 0 for name in ("read", "write"))
        except (ValueError, KeyError) as error:
            raise SystemExit(f"cannot read fio's report ({error}): {err.strip()}")
        return False
