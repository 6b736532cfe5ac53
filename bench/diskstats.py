"""The block device's own counters (/proc/diskstats), shared by the bench scripts that confirm
disk traffic with them (compare_aio.py, compare_builds.py, torch_offload_step.py)."""
import os


def device_of(path):
    """The /proc/diskstats name of the whole disk holding path (e.g. vda, nvme0n1)."""
    dev = os.stat(path).st_dev
    sysfs = os.path.realpath(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if os.path.exists(os.path.join(sysfs, "partition")):
        sysfs = os.path.dirname(sysfs)
    return os.path.basename(sysfs)


def counters(disk):
    """(read requests, read bytes, write requests, write bytes) of the disk so far."""
    with open("/proc/diskstats") as f:
        for line in f:
            p = line.split()
            if p[2] == disk:
                return int(p[3]), int(p[5]) * 512, int(p[7]), int(p[9]) * 512
    raise SystemExit(f"{disk} is not in /proc/diskstats")
