"""zinf.Engine (python/zinf/engine.py) under Debian's /usr/bin/python3: tensors through the
device and host tiers from Python, statistics as a dict, and misuse raising ZinfError naming what
failed (a lease released twice, an unknown tensor, registering after the seal)."""
import ctypes
import tempfile
import unittest

try:
    import torch
except ImportError:
    torch = None

import zinf
from zinf import ZinfError


@unittest.skipUnless(torch is not None, "torch is not installed")
class EngineTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.cfg = {"zinf": {"swap_dir": self.dir.name,
                             "budgets": {"device_bytes": "1M", "pinned_bytes": "2M"}}}

    def tearDown(self):
        self.dir.cleanup()

    def test_round_trip_through_the_tiers(self):
        with zinf.Engine(self.cfg, device="host") as e:
            ids = [e.register(f"t{i}", 256 * 1024, "param", "nvme", unit=i) for i in range(6)]
            for i, t in enumerate(ids):
                e.write(t, torch.full((65536,), float(i)))
            for step in range(2):
                for i, t in enumerate(ids):
                    lease = e.acquire(t, "device")
                    ptr = e.wait(lease)
                    view = torch.frombuffer((ctypes.c_float * 65536).from_address(ptr),
                                            dtype=torch.float32)
                    self.assertEqual(view[100].item(), float(i + step))
                    view.add_(1)
                    e.release(lease, dirty=True)
                e.end_step()
            out = torch.empty(65536)
            e.read(ids[3], out)
            self.assertTrue(torch.equal(out, torch.full((65536,), 5.0)))
            s = e.stats()
            self.assertLessEqual(s["peak_bytes"]["device_arena"], 1 << 20)
            self.assertGreater(s["bytes"]["nvme_write"], 0)

    def test_misuse_raises_naming_what(self):
        e = zinf.Engine(self.cfg, device="host")
        t = e.register("w", 4096, "param", "host")
        lease = e.acquire(t, "host")
        e.release(lease)
        with self.assertRaisesRegex(ZinfError, "released already"):
            e.release(lease)
        with self.assertRaisesRegex(ZinfError, "tensor 9 is not registered"):
            e.acquire(9, "device")
        with self.assertRaisesRegex(ZinfError, "tensor late: the engine is sealed"):
            e.register("late", 4096)
        with self.assertRaisesRegex(ValueError, "role 'weights'"):
            zinf.Engine(self.cfg).register("x", 4, role="weights")
        e.close()
        with self.assertRaisesRegex(ValueError, "closed"):
            e.acquire(t, "host")
        with self.assertRaisesRegex(ZinfError, "device_bytes"):
            zinf.Engine({"zinf": {"budgets": {"device_bytes": -1}}})


if __name__ == "__main__":
    unittest.main()
