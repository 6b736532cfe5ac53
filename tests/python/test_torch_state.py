"""zinf.torch: state in and out. model.state_dict() (and the module's own state_dict()) returns
real CPU tensors, not placeholders (the first zinf.torch returned stride-(0,0) tensors 0.26 off
and torch.save wrote 1 KB); torch.save/torch.load round-trip them; load_state_dict writes the
tiers; the optimizer's state_dict carries the moments, so a fresh offloaded model that loads both
continues bit for bit; torch's LR schedulers drive model.optimizer."""
import copy
import io
import unittest

try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    import zinf.torch as zt
    from torch_models import GPT, TorchCase, batches, config, loss_of


def train(model, steps, seed=7):
    losses = []
    for batch in batches(steps, 1, seed=seed):
        loss = loss_of(model, batch[0])
        loss.backward()
        model.step()
        losses.append(loss.item())
    return losses


@unittest.skipUnless(torch is not None, "torch is not installed")
class StateTest(TorchCase if torch is not None else unittest.TestCase):
    def test_state_dict_round_trip(self):
        net = GPT(layers=2, tied=True)
        model = zt.offload(net, config(self.swap(), "1M"), lr=3e-3)
        train(model, 3)
        sd = model.state_dict()
        self.assertEqual(list(sd), list(GPT(layers=2, tied=True).state_dict()))
        own = net.state_dict()  # the caller's own reference reads the tiers too
        for k, v in sd.items():
            self.assertTrue(torch.equal(v, own[k]), k)
            self.assertEqual(v.stride(), torch.empty(v.shape).stride(), k)
            self.assertTrue(torch.equal(v, model.gathered_param(k)), k)
        buf = io.BytesIO()
        torch.save(sd, buf)
        params = sum(p.numel() * 4 for p in GPT(layers=2).parameters())
        self.assertGreater(buf.tell(), params * 0.9)
        buf.seek(0)
        back = torch.load(buf)
        plain = GPT(layers=2, tied=True)
        plain.load_state_dict(back)
        x = next(batches(1, 1))[0][:, :-1]
        with torch.no_grad():
            self.assertLess((plain(x) - model(x)).abs().max().item(), 1e-5)
        # Into the tiers: a changed state dict, read back and computed with.
        changed = {k: v + 0.01 for k, v in sd.items()}  # tied keys get one value
        model.load_state_dict(changed)
        plain.load_state_dict(changed)
        for k, v in model.state_dict().items():
            self.assertTrue(torch.equal(v, changed[k]), k)
        with torch.no_grad():
            self.assertLess((plain(x) - model(x)).abs().max().item(), 1e-5)
        net.load_state_dict(sd)
        self.assertTrue(torch.equal(model.state_dict()["head.weight"], sd["head.weight"]))
        with self.assertRaisesRegex(RuntimeError, "size mismatch"):
            model.load_state_dict({**sd, "head.weight": torch.zeros(3, 3)})
        with self.assertRaisesRegex(ValueError, "keep_vars"):
            model.state_dict(keep_vars=True)
        model.close()

    def test_a_fresh_model_loading_both_state_dicts_continues_bit_for_bit(self):
        net = GPT(layers=2)
        twin = copy.deepcopy(net)
        a = zt.offload(net, config(self.swap(), "1M"), lr=3e-3, weight_decay=0.1)
        train(a, 4)
        model_sd, opt_sd = a.state_dict(), a.optimizer.state_dict()
        self.assertEqual(len(opt_sd["state"]), len(list(net.parameters())))
        self.assertEqual(float(opt_sd["state"][0]["step"]), 4.0)
        b = zt.offload(twin, config(self.swap(), "1M"), lr=3e-3, weight_decay=0.1)
        b.load_state_dict(model_sd)
        b.optimizer.load_state_dict(opt_sd)
        self.assertEqual(train(a, 4, seed=9), train(b, 4, seed=9))
        # torch's rules: a parameter without state there starts fresh; amsgrad is refused.
        sd = b.optimizer.state_dict()
        del sd["state"][0]
        b.optimizer.load_state_dict(sd)
        self.assertEqual(b.state_tensor("wte.weight", "exp_avg").abs().max().item(), 0.0)
        sd["param_groups"][0]["amsgrad"] = True
        with self.assertRaisesRegex(ValueError, "amsgrad"):
            b.optimizer.load_state_dict(sd)
        for k, v in a.state_dict().items():
            self.assertTrue(torch.equal(v, b.state_dict()[k]), k)
        a.close()
        b.close()

    def test_resuming_keeps_the_configs_schedule_and_the_loss_scaler(self):
        sched = {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 4, "warmup_max_lr": 1e-2,
                                                     "total_num_steps": 20,
                                                     "warmup_type": "linear"}}
        net = GPT(layers=1)
        twin = copy.deepcopy(net)

        def make(n):
            return zt.offload(n, config(self.swap(), "1M", scheduler=sched,
                                        optimizer={"type": "AdamW", "params": {"lr": 1e-2}}))
        a = make(net)
        train(a, 6)
        b = make(twin)
        b.load_state_dict(a.state_dict())
        b.optimizer.load_state_dict(a.optimizer.state_dict())
        self.assertEqual(b.optimizer.param_groups[0]["lr"], a.optimizer.param_groups[0]["lr"])
        self.assertEqual(b.global_steps, 6)
        self.assertEqual(train(a, 3, seed=9), train(b, 3, seed=9))
        a.close()
        b.close()

    def test_an_existing_torch_optimizer_is_taken_with_its_state_and_scheduler(self):
        net = GPT(layers=1)
        opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
        loss_of(net, next(batches(1, 1))[0]).backward()
        opt.step()
        opt.zero_grad()
        moment = opt.state[net.wte.weight]["exp_avg"].clone()
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.0 if s >= 1 else 1.0)
        model = zt.offload(net, config(self.swap(), "1M"), optimizer=opt)
        self.assertTrue(torch.equal(model.state_tensor("wte.weight", "exp_avg"), moment))
        sched.step()  # lr 0 on the caller's optimizer: the groups are shared
        self.assertEqual(model.optimizer.param_groups[0]["lr"], 0.0)
        before = model.state_dict()
        train(model, 1)
        for k, v in model.state_dict().items():  # AdamW at lr 0 moves nothing
            self.assertTrue(torch.equal(v, before[k]), k)
        model.close()

    def test_a_refused_offload_leaves_the_module_as_it_was(self):
        net = GPT(layers=1)
        w0 = net.head.weight.detach().clone()
        bad = {"type": "WarmupDecayLR", "params": {"warmup_num_steps": 10}}
        with self.assertRaisesRegex(ValueError, "total_num_steps"):
            zt.offload(net, config(self.swap(), "1M", scheduler=bad))
        with self.assertRaisesRegex(ValueError, "more than one parameter group"):
            zt.offload(net, config(self.swap(), "1M"),
                       param_groups=[{"params": list(net.parameters())},
                                     {"params": [net.head.weight]}])
        self.assertIs(type(net.head.weight), torch.nn.Parameter)
        self.assertTrue(torch.equal(net.head.weight.detach(), w0))
        zt.offload(net, config(self.swap(), "1M")).close()  # and it can still be offloaded

    def test_torch_lr_schedulers_drive_the_optimizer(self):
        net = GPT(layers=1)
        plain = copy.deepcopy(net)
        opt = torch.optim.AdamW(plain.parameters(), lr=1e-2, weight_decay=0.0)
        model = zt.offload(net, config(self.swap(), "1M"), lr=1e-2)
        self.assertIsInstance(model.optimizer, torch.optim.Optimizer)
        s1 = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.1)
        s2 = torch.optim.lr_scheduler.StepLR(model.optimizer, step_size=2, gamma=0.1)
        for batch in batches(6, 1):
            lp = loss_of(plain, batch[0])
            lp.backward()
            opt.step()
            opt.zero_grad()
            s1.step()
            lz = loss_of(model, batch[0])
            lz.backward()
            model.step()
            s2.step()
            self.assertEqual(s1.get_last_lr(), s2.get_last_lr())
            self.assertLess(abs(lp.item() - lz.item()), 1e-5 * lp.item())
        self.assertAlmostEqual(model.optimizer.param_groups[0]["lr"], 1e-5)
        model.close()


if __name__ == "__main__":
    unittest.main()
