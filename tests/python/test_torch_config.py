"""zinf.torch: every config key honored or refused, with DeepSpeed's meaning.

The first zinf.torch accepted the optimizer, scheduler, bf16/fp16 blocks, gradient_clipping and
offload_param.device "cpu" and ignored them (an lr of 0.5 there changed nothing). Each case
here shows a block taking effect against plain PyTorch doing what DeepSpeed would, or a key
refused naming itself; and docs/torch.md's table is the code's (zinf.torch._config.KEYS)."""
import copy
import json
import os
import tempfile
import unittest

try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    import zinf.torch as zt
    from zinf import ZinfError
    from zinf.torch import _config
    from torch_models import GPT, TorchCase, batches, config, loss_of

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def losses(model, steps=6, ds=False):
    out = []
    for batch in batches(steps, 1):
        loss = loss_of(model, batch[0])
        if ds:
            model.backward(loss)
        else:
            loss.backward()
        model.step()
        out.append(loss.item())
    return out


def plain_losses(net, opt, steps=6, clip=0.0, sched=None):
    out = []
    for batch in batches(steps, 1):
        loss = loss_of(net, batch[0])
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(net.parameters(), clip)
        opt.step()
        opt.zero_grad()
        if sched:
            sched()
        out.append(loss.item())
    return out


@unittest.skipUnless(torch is not None, "torch is not installed")
class ConfigTest(TorchCase if torch is not None else unittest.TestCase):
    def setUp(self):
        super().setUp()
        self.net = GPT(layers=1)

    def cfg(self, **extra):
        return config(tempfile.mkdtemp(dir=self.dir.name), "1M", **extra)

    def close_to(self, want, got, rel=1e-5):
        for w, g in zip(want, got):
            self.assertLess(abs(w - g), rel * abs(w), (want, got))

    def test_the_optimizer_block_takes_effect(self):
        plain = copy.deepcopy(self.net)
        opt = torch.optim.Adam(plain.parameters(), lr=0.05, betas=(0.8, 0.99), eps=1e-6,
                               weight_decay=0.01)  # L2 decay: adam_w_mode false
        want = plain_losses(plain, opt)
        block = {"type": "Adam", "params": {"lr": 0.05, "betas": [0.8, 0.99], "eps": 1e-6,
                                            "weight_decay": 0.01, "adam_w_mode": False}}
        model = zt.offload(self.net, self.cfg(optimizer=block))
        self.close_to(want, losses(model))
        self.assertEqual(model.optimizer.param_groups[0]["lr"], 0.05)
        model.close()
        with self.assertRaisesRegex(ValueError, "optimizer block"):
            zt.offload(GPT(layers=1), self.cfg(optimizer=block), lr=1e-3)
        with self.assertRaisesRegex(ValueError, "amsgrad"):
            zt.offload(GPT(layers=1), self.cfg(optimizer={"type": "AdamW",
                                                          "params": {"amsgrad": True}}))

    def test_the_scheduler_block_and_its_absence(self):
        sched = {"type": "WarmupLR", "params": {"warmup_min_lr": 0.0, "warmup_max_lr": 0.01,
                                                "warmup_num_steps": 4, "warmup_type": "linear"}}
        model = zt.offload(self.net, self.cfg(scheduler=sched))
        lrs = [model.optimizer.param_groups[0]["lr"]]
        for batch in batches(6, 1):
            loss_of(model, batch[0]).backward()
            model.step()
            lrs.append(model.optimizer.param_groups[0]["lr"])
        # DeepSpeed's WarmupLR: lr = min + (max - min) * step / warmup until warmup.
        self.assertEqual(lrs, [0.0, 0.0025, 0.005, 0.0075, 0.01, 0.01, 0.01])
        model.close()
        model = zt.offload(GPT(layers=1), self.cfg(optimizer={"type": "AdamW",
                                                              "params": {"lr": 0.02}}))
        self.assertIsNone(model.lr_scheduler)  # no block: DeepSpeed's constant lr
        losses(model, 3)
        self.assertEqual(model.optimizer.param_groups[0]["lr"], 0.02)
        model.close()
        cos = {"type": "WarmupCosineLR", "params": {"warmup_num_steps": 2}}
        with self.assertRaisesRegex(ValueError, "total_num_steps"):
            zt.offload(GPT(layers=1), self.cfg(scheduler=cos))

    def test_gradient_clipping_takes_effect(self):
        plain = copy.deepcopy(self.net)
        opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.0)
        want = plain_losses(plain, opt, clip=0.05)
        model = zt.offload(self.net, self.cfg(gradient_clipping=0.05), lr=1e-2)
        self.close_to(want, losses(model))
        model.close()

    def test_accumulation_from_the_config_is_deepspeeds(self):
        plain = copy.deepcopy(self.net)
        opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.0)
        want = []
        for batch in batches(4, 2):
            for chunk in batch:
                (loss_of(plain, chunk) / 2).backward()
            opt.step()
            opt.zero_grad()
            want.append(loss_of(plain, batch[0]).item())
        model = zt.offload(self.net, self.cfg(train_batch_size=8,
                                              train_micro_batch_size_per_gpu=4), lr=1e-2)
        got = []
        for batch in batches(4, 2):
            applied = []
            for chunk in batch:
                model.backward(loss_of(model, chunk))
                applied.append(model.step())
            self.assertEqual(applied, [False, True])
            with torch.no_grad():
                got.append(loss_of(model, batch[0]).item())
        self.close_to(want, got)
        model.close()

    def test_overlap_adam_steps_in_backward_with_the_same_result(self):
        # Without clipping the step is the same arithmetic, only earlier: equal losses.
        twin = copy.deepcopy(self.net)
        a = zt.offload(self.net, self.cfg(), lr=1e-2)
        b = zt.offload(twin, self.cfg(zinf={"swap_dir": tempfile.mkdtemp(dir=self.dir.name),
                                            "overlap_adam": True}), lr=1e-2)
        self.assertEqual(losses(a, 5), losses(b, 5))
        for k, v in a.state_dict().items():
            self.assertTrue(torch.equal(v, b.state_dict()[k]), k)
        a.close()
        # Two backwards in one window without the config's accumulation: refused, loudly.
        chunk = next(batches(1, 1))[0]
        loss_of(b, chunk).backward()
        with self.assertRaisesRegex(RuntimeError, "gradient_accumulation_steps"):
            loss_of(b, chunk).backward()
        b.close()
        with self.assertRaisesRegex(Exception, "overlap_adam"):  # the engine refuses it first
            zt.offload(GPT(layers=1), self.cfg(fp16={"enabled": True},
                                               zinf={"swap_dir": self.dir.name,
                                                     "overlap_adam": True}))

    def test_offload_devices_pick_the_homes(self):
        c = self.cfg(zero_optimization={"offload_param": {"device": "cpu"},
                                        "offload_optimizer": {"device": "cpu"}})
        model = zt.offload(self.net, c)
        losses(model, 3)
        s = model.stats()
        self.assertEqual(s["bytes"]["nvme_read"] + s["bytes"]["nvme_write"], 0, s)
        model.close()
        c = self.cfg()
        c["zero_optimization"] = {"offload_param": {"device": "nvme",
                                                    "nvme_path": c["zinf"]["swap_dir"]}}
        model = zt.offload(GPT(layers=1), c, grad_home="host")
        losses(model, 3)
        self.assertGreater(model.stats()["bytes"]["nvme_write"], 0)  # homed there
        model.close()
        with self.assertRaisesRegex(ValueError, r'offload_param\.device "none"'):
            zt.offload(GPT(layers=1), self.cfg(zero_optimization={"offload_param":
                                                                   {"device": "none"}}))
        with self.assertRaisesRegex(ValueError, "give one"):
            zt.offload(GPT(layers=1), self.cfg(zero_optimization={"offload_param":
                                                                   {"device": "cpu"}}),
                       param_home="nvme")

    def test_keys_without_effect_here_are_refused_or_warned(self):
        for extra, key in (({"zinf": {"model": {"layers": 2}}}, "zinf.model.layers"),
                           ({"zinf": {"seed": 5}}, "zinf.seed"),
                           ({"zinf": {"pipeline_depth": 4}}, "zinf.pipeline_depth"),
                           ({"zinf": {"checkpoint": {"dir": "/tmp/x"}}}, "zinf.checkpoint.dir"),
                           ({"wall_clock_breakdown": True}, "wall_clock_breakdown"),
                           ({"fp16": {"enabled": True, "auto_cast": True}}, "fp16.auto_cast")):
            with self.subTest(key=key):
                c = self.cfg()
                for k, v in extra.items():
                    c[k] = {**c.get(k, {}), **v} if isinstance(v, dict) else v
                with self.assertRaisesRegex(ValueError, key.replace(".", r"\.")):
                    zt.offload(GPT(layers=1), c)
        # Neutral values ask for nothing.
        model = zt.offload(GPT(layers=1), self.cfg(wall_clock_breakdown=False,
                                                   steps_per_print=1000))
        model.close()
        # DeepSpeed's staging-buffer sizes have no effect: the engine names them in its one
        # warning, and refuses them under zinf.strict.
        c = self.cfg()
        c["zero_optimization"] = {"offload_param": {"device": "nvme", "buffer_count": 7,
                                                    "nvme_path": c["zinf"]["swap_dir"]}}
        zt.offload(GPT(layers=1), c).close()
        c["zinf"]["strict"] = True
        with self.assertRaisesRegex(ZinfError, r"offload_param\.buffer_count=7.*strict"):
            zt.offload(GPT(layers=1), c)
        # Unknown keys and bad values: the engine names them.
        with self.assertRaisesRegex(Exception, "did you mean"):
            zt.offload(GPT(layers=1), self.cfg(gradient_cliping=1.0))

    def test_every_key_the_engine_knows_is_in_the_table(self):
        # The engine's effective config lists every key zinf reads; each must have a rule.
        import subprocess
        zinf_bin = os.path.join(os.path.dirname(os.environ.get("ZINF_LIBRARY", "")), "..", "..",
                                "zinf")
        if not os.path.exists(zinf_bin):
            self.skipTest("the zinf command is not built next to the library")
        out = subprocess.run([zinf_bin, "train", "--print-config"], capture_output=True,
                             text=True, check=True).stdout
        import re
        text = re.sub(r"//[^\n]*", "", out[out.index("{"):out.rindex("}") + 1])
        doc = json.loads(text)
        missing = [p for p, _ in _config._leaves(doc) if _config._rule(p) is None]
        self.assertEqual(missing, [])

    def test_the_docs_table_is_the_codes(self):
        with open(os.path.join(ROOT, "docs", "torch.md")) as f:
            text = f.read()
        self.assertTrue(_config.doc_table() in text,
                        "docs/torch.md's table of keys differs from zinf.torch._config.KEYS; "
                        "print it with: python3 -c 'from zinf.torch import _config; "
                        "print(_config.doc_table(), end=\"\")'")


if __name__ == "__main__":
    unittest.main()
