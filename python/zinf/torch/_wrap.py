"""Wrap units: which module subtrees zinf leases whole (FSDP's auto-wrap).

A unit is a module whose forward PyTorch calls; zinf leases every parameter of its subtree
around that forward (so code inside it may read any of them: nn.MultiheadAttention reading
out_proj.weight directly, a weight shared by two of its submodules) and again in backward. The
root module is the last unit: it holds the parameters no other unit contains, leased for the
whole forward.

Policies, as FSDP takes them (auto_wrap_policy=...):
- None (the default): each child of the root that owns parameters, looking through
  nn.ModuleList / nn.ModuleDict (containers PyTorch never calls): a GPT's blocks, its
  embeddings and its head. An nn.ParameterList / ParameterDict's parameters stay the root's.
- a set, list or tuple of module classes: every module of those classes, outermost first
  (FSDP's ModuleWrapPolicy / transformer_auto_wrap_policy).
- a callable with FSDP1's signature policy(module, recurse, nonwrapped_numel) -> bool:
  recurse=True asks whether to look inside the module, recurse=False whether to make it a unit
  given the parameters of its subtree no unit below has taken. FSDP's own
  size_based_auto_wrap_policy and transformer_auto_wrap_policy (functools.partial) work, and so
  do this module's.

A container without a forward of its own (ModuleList, ModuleDict) is refused as a unit: its
hooks would never run.
"""
import torch

_CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict, torch.nn.ParameterList,
               torch.nn.ParameterDict)


def transformer_auto_wrap_policy(module, recurse, nonwrapped_numel, transformer_layer_cls=()):
    """FSDP's: every module of one of `transformer_layer_cls` is a unit."""
    if recurse:
        return True
    return isinstance(module, tuple(transformer_layer_cls))


def size_based_auto_wrap_policy(module, recurse, nonwrapped_numel, min_num_params=int(1e8),
                                force_leaf_modules=None, exclude_wrap_modules=None):
    """FSDP's: a module whose not-yet-wrapped parameters reach min_num_params is a unit;
    nn.MultiheadAttention is not looked into, containers are never units."""
    force_leaf = tuple(force_leaf_modules or (torch.nn.MultiheadAttention,))
    exclude = tuple(exclude_wrap_modules or (torch.nn.ModuleList, torch.nn.ModuleDict))
    if recurse:
        return not isinstance(module, force_leaf)
    return nonwrapped_numel >= min_num_params and not isinstance(module, exclude)


class ModuleWrapPolicy:
    """FSDP's ModuleWrapPolicy: every module of these classes is a unit."""

    def __init__(self, module_classes):
        self.module_classes = tuple(module_classes)

    def __call__(self, module, recurse, nonwrapped_numel):
        return True if recurse else isinstance(module, self.module_classes)


def _owns_params(m):
    return any(True for _ in m.parameters())


def _default_units(root):
    units = []

    def visit(m):
        for child in m.children():
            if isinstance(child, (torch.nn.ModuleList, torch.nn.ModuleDict)):
                visit(child)
            elif _owns_params(child) and not isinstance(child, (torch.nn.ParameterList,
                                                                 torch.nn.ParameterDict)):
                units.append(child)  # (a ParameterList's parameters stay the root's)
    visit(root)
    return units


def _policy_units(root, policy):
    units = []
    taken = set()  # ids of parameters a unit below has taken

    def untaken(m):
        return sum(p.numel() for p in m.parameters() if id(p) not in taken)

    def visit(m):
        if not policy(module=m, recurse=True, nonwrapped_numel=untaken(m)):
            return
        for child in m.children():
            visit(child)
        if m is not root and policy(module=m, recurse=False, nonwrapped_numel=untaken(m)):
            units.append(m)
            taken.update(id(p) for p in m.parameters())
    visit(root)
    return units


def find_units(root, auto_wrap_policy=None):
    """The wrap units below `root` (root excluded), each (qualified name, module), in the order
    named_modules() lists them. Raises ValueError for a policy that picks a container."""
    if auto_wrap_policy is None:
        mods = _default_units(root)
    else:
        policy = auto_wrap_policy
        if isinstance(policy, (set, frozenset, list, tuple)):
            classes = tuple(policy)
            if not all(isinstance(c, type) and issubclass(c, torch.nn.Module) for c in classes):
                raise ValueError("zinf.torch.offload: auto_wrap_policy as a collection must hold "
                                 f"nn.Module classes; got {sorted(map(repr, classes))}")
            policy = ModuleWrapPolicy(classes)
        elif not callable(policy):
            raise ValueError("zinf.torch.offload: auto_wrap_policy must be None, a set of "
                             "nn.Module classes or a callable policy(module, recurse, "
                             f"nonwrapped_numel); got {type(policy).__name__}")
        mods = _policy_units(root, policy)
    names = {id(m): n for n, m in root.named_modules()}
    order = {k: i for i, k in enumerate(names)}
    out = []
    for m in sorted(mods, key=lambda m: order[id(m)]):
        if isinstance(m, _CONTAINERS):
            raise ValueError(f"zinf.torch.offload: the wrap policy made {names[id(m)]!r} (a "
                             f"{type(m).__name__}) a unit, but PyTorch never calls a container's "
                             "forward, so its parameters could never be leased; make its "
                             "children units instead")
        out.append((names[id(m)], m))
    return out




def lease_sets(root, units):
    """For each unit (and last the root) the parameters it leases: those of the modules in its
    subtree down to (not into) the units nested in it. A parameter two of them reach (a tied
    weight) is in both; each parameter once per set, in named_parameters() order."""
    stops = {id(m) for _, m in units}
    out = []
    for top in [m for _, m in units] + [root]:
        seen, params = set(), []
        stack = [top]
        while stack:
            m = stack.pop(0)
            for p in m.parameters(recurse=False):
                if id(p) not in seen:
                    seen.add(id(p))
                    params.append(p)
            stack[0:0] = [c for c in m.children() if id(c) not in stops]
        out.append(params)
    return out
