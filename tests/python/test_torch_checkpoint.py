"""zinf.torch: checkpoints in zinf's crash-consistent format.

- save_checkpoint / load_checkpoint: a fresh model loading a checkpoint continues bit for bit
  (bf16 weights, a frozen parameter, a tied weight, the config's schedule, clipping);
  client_state comes back; keep prunes; a checkpoint of another module, or with a corrupt
  byte, is refused naming what.
- `zinf ckpt verify | inspect | export` read it: export writes every parameter under the
  module's own name, equal to model.state_dict().
- kill -9 during a run (a job that checkpoints every 2 steps, killed after step 5), then a run
  resuming from the latest committed checkpoint: its losses equal the uninterrupted run's, bit
  for bit."""
import copy
import json
import os
import signal
import struct
import subprocess
import sys
import tempfile
import time
import unittest

try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    import zinf.torch as zt
    from torch_models import GPT, TorchCase, batches, config, loss_of

HERE = os.path.dirname(os.path.abspath(__file__))
ZINF = os.path.join(os.path.dirname(os.environ.get("ZINF_LIBRARY", "")), "..", "..", "zinf")


def read_safetensors(path):
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        a, b = e["data_offsets"]
        dtype = {"F32": torch.float32, "BF16": torch.bfloat16}[e["dtype"]]
        out[name] = torch.frombuffer(bytearray(raw[8 + n + a:8 + n + b]),
                                     dtype=dtype).reshape(e["shape"])
    return out


def train(model, steps, seed):
    losses = []
    for batch in batches(steps, 1, seed=seed):
        loss = loss_of(model, batch[0])
        model.backward(loss)
        model.step()
        losses.append(loss.item())
    return losses


@unittest.skipUnless(torch is not None, "torch is not installed")
class CheckpointTest(TorchCase if torch is not None else unittest.TestCase):
    def make(self, net):
        sched = {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 3, "total_num_steps": 30,
                                                     "warmup_max_lr": 1e-2,
                                                     "warmup_type": "linear"}}
        return zt.offload(net, config(self.swap(), "1M", bf16={"enabled": True},
                                      scheduler=sched, gradient_clipping=0.5,
                                      optimizer={"type": "AdamW", "params": {"lr": 1e-2}}),
                          param_groups=[{"params": [p for p in net.parameters()
                                                    if p.requires_grad]}])

    def test_a_fresh_model_loading_a_checkpoint_continues_bit_for_bit(self):
        net = GPT(layers=2, tied=True)
        net.wpe.weight.requires_grad_(False)
        twin = copy.deepcopy(net)
        root = os.path.join(self.dir.name, "ckpt")
        a = self.make(net)
        train(a, 3, seed=1)
        d = a.save_checkpoint(root, client_state={"epoch": 1, "note": "after 3"})
        self.assertEqual(os.path.basename(d), "step-0000000003")
        b = self.make(twin)
        self.assertEqual(b.load_checkpoint(root), {"epoch": 1, "note": "after 3"})
        self.assertEqual(b.global_steps, 3)
        self.assertEqual(train(a, 4, seed=2), train(b, 4, seed=2))
        for k, v in a.state_dict().items():
            self.assertTrue(torch.equal(v, b.state_dict()[k]), k)
        # keep: the latest n stay.
        for _ in range(3):
            train(a, 1, seed=3)
            a.save_checkpoint(root, keep=2)
        self.assertEqual(sorted(os.listdir(root)), ["step-0000000009", "step-0000000010"])
        with self.assertRaisesRegex(FileExistsError, "step 10"):
            a.save_checkpoint(root)
        # Checked against this module and its bytes.
        other = self.make(GPT(layers=1, tied=True))
        with self.assertRaisesRegex(ValueError, "another module"):
            other.load_checkpoint(root)
        state = os.path.join(root, "step-0000000010", "state.bin")
        with open(state, "r+b") as f:
            f.seek(100)
            byte = f.read(1)
            f.seek(100)
            f.write(bytes([byte[0] ^ 0xFF]))
        with self.assertRaisesRegex(ValueError, "xxHash64"):
            b.load_checkpoint(root)
        for m in (a, b, other):
            m.close()

    def test_buffers_groups_and_refusals(self):
        # BatchNorm's running statistics come back too; groups are checked by membership.
        def net_of():
            torch.manual_seed(0)
            return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                                       torch.nn.Linear(16, 4))

        def groups(net):
            return [{"params": [p for p in net.parameters() if p.dim() > 1],
                     "weight_decay": 0.1},
                    {"params": [p for p in net.parameters() if p.dim() <= 1],
                     "weight_decay": 0.0, "lr": 5e-3}]
        root = os.path.join(self.dir.name, "bn")
        g = torch.Generator().manual_seed(3)
        data = [torch.randn(6, 8, generator=g) for _ in range(6)]

        def run(model, xs):
            out = []
            for x in xs:
                loss = model(x).square().mean()
                loss.backward()
                model.step()
                out.append(loss.item())
            return out
        a_net = net_of()
        a = zt.offload(a_net, config(self.swap(), "1M"), param_groups=groups(a_net), lr=1e-2)
        run(a, data[:3])
        with self.assertRaisesRegex(RuntimeError, "accumulation window"):
            a(data[0]).sum().backward()
            a.save_checkpoint(root)
        a.zero_grad()
        a.save_checkpoint(root)
        b_net = net_of()
        b = zt.offload(b_net, config(self.swap(), "1M"), param_groups=groups(b_net), lr=1e-2)
        b.load_checkpoint(root)
        self.assertTrue(torch.equal(b_net[1].running_mean, a_net[1].running_mean))
        self.assertEqual(int(b_net[1].num_batches_tracked), 4)  # 3 steps and the refused one
        self.assertEqual(run(a, data[3:]), run(b, data[3:]))
        one = zt.offload(net_of(), config(self.swap(), "1M"), lr=1e-2)  # one group
        with self.assertRaisesRegex(ValueError, "groups"):
            one.load_checkpoint(root)
        # A failed load changes nothing: the last shard corrupt, the first still as it was.
        before = b.state_dict()
        last = sorted(os.listdir(root))[-1]
        with open(os.path.join(root, last, "state.bin"), "r+b") as f:
            f.seek(-4, os.SEEK_END)
            f.write(b"\x01\x02\x03\x04")
        with self.assertRaisesRegex(ValueError, "xxHash64"):
            b.load_checkpoint(root)
        for k, v in b.state_dict().items():
            self.assertTrue(torch.equal(v, before[k]), k)
        # Saving: keep >= 1, JSON without NaN, no newer checkpoints in the root.
        with self.assertRaisesRegex(ValueError, "keep=0"):
            b.save_checkpoint(os.path.join(self.dir.name, "k"), keep=0)
        with self.assertRaisesRegex(ValueError, "NaN"):
            b.save_checkpoint(os.path.join(self.dir.name, "n"),
                              client_state={"best": float("inf")})
        self.assertFalse(os.path.exists(os.path.join(self.dir.name, "n")))  # nothing written
        with self.assertRaisesRegex(FileExistsError, "newer"):
            one.save_checkpoint(root)  # step 0 into a root holding step 3
        # A crashed save's directory (no manifest) is removed by the next save.
        run(b, data[:3])
        crashed = os.path.join(root, "step-0000000005")
        os.makedirs(crashed)
        open(os.path.join(crashed, "state.bin"), "wb").close()
        b.save_checkpoint(root, keep=1)
        self.assertEqual(sorted(os.listdir(root)), [f"step-{b.global_steps:010d}"])
        for m in (a, b, one):
            m.close()

    @unittest.skipUnless(os.path.exists(ZINF), "the zinf command is not built")
    def test_zinf_ckpt_reads_it(self):
        net = GPT(layers=2, tied=True)
        model = self.make(net)
        train(model, 2, seed=1)
        root = os.path.join(self.dir.name, "ckpt")
        d = model.save_checkpoint(root)
        run = subprocess.run([ZINF, "ckpt", "verify", root], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("ok: " + d, run.stdout)
        run = subprocess.run([ZINF, "ckpt", "inspect", d], capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        self.assertIn("a PyTorch GPT of", run.stdout)
        out = os.path.join(self.dir.name, "w.safetensors")
        run = subprocess.run([ZINF, "ckpt", "export", root, "--out", out, "--optimizer-state"],
                             capture_output=True, text=True)
        self.assertEqual(run.returncode, 0, run.stderr)
        exported = read_safetensors(out)
        sd = model.state_dict()
        for name in model._params:  # each parameter once (a tied weight under its first name)
            self.assertTrue(torch.equal(exported[name], sd[name]), name)
            self.assertTrue(torch.equal(exported[name + ".exp_avg"],
                                        model.state_tensor(name, "exp_avg")), name)
        with open(os.path.join(d, "state.bin"), "r+b") as f:
            f.seek(5000)
            byte = f.read(1)
            f.seek(5000)
            f.write(bytes([byte[0] ^ 1]))
        run = subprocess.run([ZINF, "ckpt", "verify", root], capture_output=True, text=True)
        self.assertEqual(run.returncode, 1)
        self.assertIn("state.bin", run.stderr)
        model.close()

    def test_kill_9_then_resume_equals_the_uninterrupted_run(self):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [HERE] + os.environ.get("PYTHONPATH", "").split(os.pathsep)))

        def job(name, *extra, wait=True):
            args = [sys.executable, os.path.join(HERE, "torch_ckpt_job.py"),
                    "--swap", tempfile.mkdtemp(dir=self.dir.name),
                    "--ckpt", os.path.join(self.dir.name, name + "-ckpt"),
                    "--losses", os.path.join(self.dir.name, name + ".jsonl"),
                    "--steps", "10"] + list(extra)
            p = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
            if wait:
                out, err = p.communicate(timeout=300)
                self.assertEqual(p.returncode, 0, err)
            return p

        def losses(name):
            with open(os.path.join(self.dir.name, name + ".jsonl")) as f:
                return [json.loads(line) for line in f]
        job("whole")
        want = {r["step"]: r["loss"] for r in losses("whole")}
        self.assertEqual(sorted(want), list(range(1, 11)))
        p = job("killed", "--sleep", "0.2", wait=False)
        deadline = time.time() + 300
        while time.time() < deadline:
            path = os.path.join(self.dir.name, "killed.jsonl")
            if os.path.exists(path) and len(losses("killed")) >= 5:
                break
            time.sleep(0.02)
        os.kill(p.pid, signal.SIGKILL)
        p.communicate()
        self.assertEqual(p.returncode, -signal.SIGKILL)
        killed_at = len(losses("killed"))
        self.assertLess(killed_at, 10, "the job ended before the kill")
        job("killed", "--resume")
        got = losses("killed")
        resumed = got[killed_at:]
        self.assertEqual(resumed[-1]["step"], 10)
        self.assertLessEqual(resumed[0]["step"], killed_at + 1)  # from a checkpoint at or before
        for r in got:
            self.assertEqual(r["loss"], want[r["step"]], r)
        if os.environ.get("ZINF_TEST_VERBOSE"):
            print(f"killed after step {killed_at}, resumed at step {resumed[0]['step']}")


if __name__ == "__main__":
    unittest.main()
