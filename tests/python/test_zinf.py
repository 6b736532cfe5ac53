"""python/zinf over libzinf.so, under Debian's /usr/bin/python3 and torch (tests/python/
CMakeLists.txt runs it): AioHandle round trips (O_DIRECT with locked tensors, buffered with odd
sizes, several queued), its errors as ZinfError naming the file; CPUAdam against torch.optim's
AdamW and Adam over 100 steps within a stated tolerance, and its refusals."""
import os
import tempfile
import unittest

try:
    import torch
except ImportError:  # the torch cases skip
    torch = None

import zinf
from zinf import ZinfError


@unittest.skipUnless(torch is not None, "torch is not installed")
class AioHandleTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.path = os.path.join(self.dir.name, "f.bin")

    def tearDown(self):
        self.dir.cleanup()

    def test_direct_round_trip_with_locked_tensors(self):
        h = zinf.AioHandle(block_size=1 << 18, queue_depth=8)
        self.assertEqual(h.get_block_size(), 1 << 18)
        self.assertEqual(h.get_queue_depth(), 8)
        out = h.new_cpu_locked_tensor(1 << 20, torch.empty(0, dtype=torch.uint8))
        back = h.new_cpu_locked_tensor(1 << 20, torch.empty(0, dtype=torch.uint8))
        self.assertEqual(out.data_ptr() % 4096, 0)
        out.copy_(torch.arange(1 << 20, dtype=torch.int64).remainder(251).to(torch.uint8))
        # Two halves queued, one wait (DeepSpeed's return values: 0 queued, the count done).
        self.assertEqual(h.async_pwrite(out[: 1 << 19], self.path, 0), 0)
        self.assertEqual(h.async_pwrite(out[1 << 19:], self.path, 1 << 19), 0)
        self.assertEqual(h.wait(), 2)
        self.assertEqual(h.sync_pread(back, self.path), 1)
        self.assertTrue(torch.equal(out, back))
        h.free_cpu_locked_tensor(out)
        h.free_cpu_locked_tensor(back)
        with self.assertRaises(ValueError):
            h.free_cpu_locked_tensor(back)

    def test_buffered_odd_sizes_and_dtypes(self):
        h = zinf.AioHandle(use_direct=False)
        x = torch.randn(100003, dtype=torch.float32)
        y = torch.empty_like(x)
        h.sync_pwrite(x, self.path, 12)
        h.sync_pread(y, self.path, 12)
        self.assertTrue(torch.equal(x, y))
        b = torch.randn(777).to(torch.bfloat16)
        h.sync_pwrite(b, self.path, 3)
        c = torch.empty_like(b)
        h.sync_pread(c, self.path, 3)
        self.assertTrue(torch.equal(b, c))

    def test_errors_name_the_file(self):
        h = zinf.AioHandle(use_direct=False)
        y = torch.empty(16, dtype=torch.uint8)
        missing = os.path.join(self.dir.name, "missing.bin")
        with self.assertRaises(ZinfError) as e:
            h.async_pread(y, missing)
        self.assertIn("missing.bin", str(e.exception))
        self.assertEqual(e.exception.status, -2)  # ZINF_E_NOT_FOUND
        h.sync_pwrite(torch.zeros(8, dtype=torch.uint8), self.path)
        # A read past the end is an error, not a short count.
        h.async_pread(y, self.path)
        with self.assertRaises(ZinfError) as e:
            h.wait()
        self.assertEqual(e.exception.status, -7)  # ZINF_E_OUT_OF_RANGE
        with self.assertRaises(ValueError):
            h.async_pread(torch.empty(8, 2)[:, 0], self.path)  # not contiguous


@unittest.skipUnless(torch is not None, "torch is not installed")
class CPUAdamTest(unittest.TestCase):
    # 100 steps of AdamW / Adam(L2) on 3 tensors against torch.optim in float32. Both compute
    # the same formula in float32 in a different order (zinf fuses it per element, with the bias
    # corrections folded into the step size); the difference stays at float32 rounding of the
    # weights' magnitude: measured below 1e-6, checked against 1e-5 (relative to max |w| = 1).
    def run_pair(self, adamw):
        torch.manual_seed(0)
        shapes = [(64, 33), (1000,), (7,)]
        a = [torch.randn(s).clamp(-1, 1) for s in shapes]
        b = [t.clone() for t in a]
        pa = [torch.nn.Parameter(t) for t in a]
        pb = [torch.nn.Parameter(t) for t in b]
        from zinf.optim import CPUAdam
        zo = CPUAdam(pa, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05,
                     adamw_mode=adamw)
        cls = torch.optim.AdamW if adamw else torch.optim.Adam
        to = cls(pb, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.05)
        worst = 0.0
        for step in range(100):
            for x, y in zip(pa, pb):
                g = torch.sin(torch.arange(x.numel(), dtype=torch.float32) * 0.37 + step)
                g = g.reshape(x.shape)
                x.grad = g.clone()
                y.grad = g.clone()
            zo.step()
            to.step()
        for x, y in zip(pa, pb):
            worst = max(worst, (x.detach() - y.detach()).abs().max().item())
        return worst

    def test_adamw_and_adam_match_torch(self):
        self.assertLess(self.run_pair(adamw=True), 1e-5)
        self.assertLess(self.run_pair(adamw=False), 1e-5)

    def test_group_in_one_call_equals_one_call_per_tensor(self):
        # CPUAdam steps each group with one zinf_adam_step_many call: bit for bit zinf_adam_step
        # once per tensor, with each tensor's own step count (one skips steps: grad None), two
        # groups with their own lr.
        import ctypes
        from zinf import _lib
        from zinf.optim import CPUAdam
        torch.manual_seed(1)
        shapes = [(300, 17), (5,), (4096,), (1,), (2, 3, 70)]
        a = [torch.nn.Parameter(torch.randn(s)) for s in shapes]
        ref = [t.detach().clone() for t in a]
        opt = CPUAdam([{"params": a[:3]}, {"params": a[3:], "lr": 3e-3}], lr=1e-2,
                      weight_decay=0.01)
        params = _lib.AdamParams(ctypes.sizeof(_lib.AdamParams), 1e-2, 0.9, 0.999, 1e-8, 0.01,
                                 1, 1, 0)
        h = ctypes.c_void_p()
        _lib.check(_lib.lib.zinf_adam_create(ctypes.byref(params), ctypes.byref(h)))
        m = [torch.zeros(s) for s in shapes]
        v = [torch.zeros(s) for s in shapes]
        steps = [0] * len(shapes)
        for step in range(12):
            for i, x in enumerate(a):
                if i == 1 and step % 3 == 0:
                    x.grad = None
                    continue
                g = torch.cos(torch.arange(x.numel(), dtype=torch.float32) * 0.11 + step)
                g = g.reshape(x.shape)
                x.grad = g
                gc = x.grad.contiguous()
                steps[i] += 1
                _lib.check(_lib.lib.zinf_adam_step(
                    h, steps[i], 1e-2 if i < 3 else 3e-3, ref[i].data_ptr(), gc.data_ptr(),
                    _lib.DTYPE_F32, m[i].data_ptr(),
                    v[i].data_ptr(), x.numel(), None, 0))
            opt.step()
        _lib.lib.zinf_adam_destroy(h)
        for i, x in enumerate(a):
            self.assertTrue(torch.equal(x.detach(), ref[i]), f"tensor {i}")
            self.assertEqual(opt.state[x]["step"], steps[i])
            self.assertTrue(torch.equal(opt.state[x]["exp_avg_sq"], v[i]), f"tensor {i}")

    def test_refusals(self):
        from zinf.optim import CPUAdam
        p = [torch.nn.Parameter(torch.zeros(4))]
        with self.assertRaises(ValueError):
            CPUAdam(p, amsgrad=True)
        with self.assertRaises(ValueError):
            CPUAdam(p, fp32_optimizer_states=False)
        with self.assertRaises(ZinfError) as e:
            CPUAdam(p, betas=(1.0, 0.999)).step() if p[0].grad is not None else None
            p[0].grad = torch.zeros(4)
            CPUAdam(p, betas=(1.0, 0.999)).step()
        self.assertIn("beta1", str(e.exception))
        q = [torch.nn.Parameter(torch.zeros(4, dtype=torch.float64))]
        q[0].grad = torch.zeros(4, dtype=torch.float64)
        with self.assertRaises(ValueError):
            CPUAdam(q).step()


class VersionTest(unittest.TestCase):
    def test_version(self):
        self.assertEqual(zinf.__version__, "0.1.0")


if __name__ == "__main__":
    unittest.main()
