"""strata.offload — ZeRO-Infinity-style parameter offload for any torch.nn.Module.

Every parameter lives in a strata store. Each submodule that owns parameters gets them fetched
before its forward and before its backward, and dropped again once the resident parameters
exceed `host_memory` bytes (least recently used first; parameters are read-only between
optimizer steps, so dropping needs no write-back). The first forward/backward pass records the
order in which submodules ran; from then on, fetching one starts the asynchronous read of the
next in that order (reversed in backward), so I/O overlaps compute.

torch 1.13 has no full backward PRE-hook: the forward hook routes the submodule's outputs
through an identity autograd Function whose backward fetches the parameters — it runs just
before the submodule's own backward nodes. Saved tensors still point at the parameter (a
leaf), so restoring `param.data` restores what backward sees.

`module.state_dict()` returns the current weights as ordinary tensors (read from the store).
strata.AdamW recognises offloaded parameters: it fetches each for its update and writes it back.
Gradients stay ordinary tensors in host memory (not counted in `host_memory`).
One thread; one forward/backward at a time.
"""
import collections
import weakref

import torch

from .store import Store, empty_aligned

_EMPTY = torch.empty(0, dtype=torch.float32)


class _FetchForBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, owner_ref, module_ref, *tensors):
        ctx.owner_ref, ctx.module_ref = owner_ref, module_ref
        return tensors if len(tensors) != 1 else tensors[0]

    @staticmethod
    def backward(ctx, *grads):
        owner = ctx.owner_ref()
        module = ctx.module_ref()
        if owner is not None and module is not None:
            owner._fetch(module, backward=True)
        return (None, None) + grads


class Offload:
    def __init__(self, module, path, host_memory=None, capacity_bytes=None, prefetch=True,
                 resume=False, verify_reads="always"):
        self.module = module
        self.path = str(path)
        self.prefetch = prefetch
        self._owners = []        # submodules that own parameters directly
        self._owner = {}         # param -> its submodule
        self._params = {}        # param -> (store name, shape)
        total = 0
        for name, sub in module.named_modules():
            own = list(sub.named_parameters(recurse=False))
            if not own:
                continue
            for pname, p in own:
                if p.dtype != torch.float32 or p.device.type != "cpu":
                    raise ValueError(f"parameter {name}.{pname}: strata.offload takes fp32 CPU parameters")
                if p in self._params:
                    raise ValueError(f"parameter {name}.{pname} is shared between modules; "
                                     "strata.offload keeps one owner per parameter")
                self._params[p] = ((name + "." if name else "") + pname, tuple(p.shape))
                self._owner[p] = sub
                total += p.numel() * 4
            self._owners.append(sub)
        largest = max((sum(p.numel() * 4 for p in s.parameters(recurse=False)) for s in self._owners),
                      default=0)
        self.host_memory = int(host_memory) if host_memory is not None else max(total, 1)
        if self.host_memory < 2 * largest:
            raise ValueError(f"host_memory {self.host_memory} bytes is below twice the largest "
                             f"submodule's parameters ({largest} bytes): nothing could prefetch")
        if resume:  # the weights of the last commit replace the module's own
            self.store = Store(self.path, verify_reads=verify_reads)
            for p, (name, shape) in self._params.items():
                dtype, stored = self.store.info(name)
                if dtype != torch.float32 or tuple(stored) != shape:
                    raise ValueError(f"store {self.path}: tensor {name} is {dtype} {tuple(stored)}, "
                                     f"the module's parameter is float32 {shape}")
        else:
            self.store = Store.create(self.path, capacity_bytes or (3 * total + (64 << 20)),
                                      verify_reads=verify_reads)
            for p, (name, _) in self._params.items():
                self.store.put(name, p.data.contiguous())
            self.store.commit(0)
        for p in self._params:
            p.data = _EMPTY
            p._strata_offload = self
        self._resident = collections.OrderedDict()  # module -> bytes, LRU order
        self._pending = {}      # module -> [(param, buffer, ticket)]
        self._order = []        # forward order of owner modules, recorded on the first pass
        self._recording = True
        self._handles = []
        ref = weakref.ref(self)
        for sub in self._owners:
            self._handles.append(sub.register_forward_pre_hook(_pre_forward(ref)))
            self._handles.append(sub.register_forward_hook(_post_forward(ref)))
            self._handles.append(sub._register_state_dict_hook(_state_dict_hook(ref)))
        self.fetched_bytes = 0
        self.written_bytes = 0
        self.peak_resident_bytes = 0

    # --- residency ----------------------------------------------------------------------------
    def _module_bytes(self, module):
        return sum(self._numel(p) * 4 for p in module.parameters(recurse=False))

    def _start_read(self, module):
        if module in self._resident or module in self._pending:
            return
        reads = []
        for p in module.parameters(recurse=False):
            name, shape = self._params[p]
            buffer = empty_aligned(shape)
            reads.append((p, buffer, self.store.get_async(name, buffer)))
        self._pending[module] = reads

    def _fetch(self, module, backward=False):
        if module not in self._resident:
            self._make_room(self._module_bytes(module), keep=module)
            self._start_read(module)
            for p, buffer, ticket in self._pending.pop(module):
                self.store.wait(ticket)
                p.data = buffer
                self.fetched_bytes += buffer.numel() * 4
            self._resident[module] = self._module_bytes(module)
        self._resident.move_to_end(module)
        if backward:
            self._recording = False  # the forward pass, and so the order, is complete
        if self._recording and not backward and module not in self._order:
            self._order.append(module)
        elif self.prefetch and module in self._order and not self._recording:
            i = self._order.index(module)
            j = i - 1 if backward else i + 1
            if 0 <= j < len(self._order):
                nxt = self._order[j]
                if nxt not in self._resident and nxt not in self._pending:
                    self._make_room(self._module_bytes(nxt), keep=module)
                    self._start_read(nxt)
        self._track_peak()

    def _pending_bytes(self):
        return sum(b.numel() * 4 for reads in self._pending.values() for _, b, _ in reads)

    def _track_peak(self):
        now = sum(self._resident.values()) + self._pending_bytes()
        self.peak_resident_bytes = max(self.peak_resident_bytes, now)

    def _make_room(self, need, keep):
        while self._resident and sum(self._resident.values()) + self._pending_bytes() + need > self.host_memory:
            victim = next((m for m in self._resident if m is not keep), None)
            if victim is None:
                break
            self._drop(victim)

    def _drop(self, module):
        self._resident.pop(module, None)
        for p in module.parameters(recurse=False):
            p.data = _EMPTY

    def release_all(self):
        """Drops every resident parameter (e.g. before measuring memory)."""
        for module in list(self._resident):
            self._drop(module)

    # --- for strata.AdamW ---------------------------------------------------------------------
    def _numel(self, p):
        n = 1
        for d in self._params[p][1]:
            n *= d
        return n

    def _shape(self, p):
        return self._params[p][1]

    def _update(self, params, fn):
        """Runs fn(param, fp32 data) on each offloaded param and writes the result back, as a
        pipeline: the next param's read and the previous one's write run while fn runs. A
        resident param is updated in place; the others pass through at most three buffers
        (reading, updating, writing), room for which is made first within host_memory."""
        self._recording = False  # an update follows a complete pass
        if not params:
            return
        largest = max(self._numel(p) * 4 for p in params)
        self._make_room(2 * largest, keep=None)
        reads, writes = {}, []

        def start(p):
            if self._owner[p] in self._resident:
                reads[p] = (p.data, None)
            else:
                buffer = empty_aligned(self._params[p][1])
                reads[p] = (buffer, self.store.get_async(self._params[p][0], buffer))

        start(params[0])
        for i, p in enumerate(params):
            while len(writes) >= 1:  # at most one write in flight beside the current update
                self.store.wait(writes.pop(0)[0])
            if i + 1 < len(params):
                start(params[i + 1])
            data, ticket = reads.pop(p)
            if ticket is not None:
                self.store.wait(ticket)
                self.fetched_bytes += data.numel() * 4
            in_flight = sum(b.numel() * 4 for b, t in reads.values() if t is not None) + \
                (0 if ticket is None else data.numel() * 4)
            self.peak_resident_bytes = max(self.peak_resident_bytes,
                                           sum(self._resident.values()) + in_flight + largest)
            fn(p, data)
            writes.append((self.store.put_async(self._params[p][0], data), data))
            self.written_bytes += data.numel() * 4
        for ticket, _ in writes:
            self.store.wait(ticket)

    def commit(self, step=0):
        """Makes the current weights durable in the store."""
        self.store.commit(step)

    def remove(self):
        """Brings every parameter back into memory and removes the hooks."""
        for p, (name, _) in self._params.items():
            p.data = self.store.get(name)
            del p._strata_offload
        for h in self._handles:
            h.remove()
        self._handles.clear()
        self._resident.clear()


def _pre_forward(ref):
    def hook(module, inputs):
        owner = ref()
        if owner is not None:
            owner._fetch(module)
    return hook


def _post_forward(ref):
    def hook(module, inputs, output):
        owner = ref()
        if owner is None or not torch.is_grad_enabled():
            return None
        mref = weakref.ref(module)
        if torch.is_tensor(output):
            if output.requires_grad:
                return _FetchForBackward.apply(ref, mref, output)
            return None
        if isinstance(output, tuple) and any(torch.is_tensor(t) and t.requires_grad for t in output):
            idx = [i for i, t in enumerate(output) if torch.is_tensor(t) and t.requires_grad]
            wrapped = _FetchForBackward.apply(ref, mref, *[output[i] for i in idx])
            wrapped = wrapped if isinstance(wrapped, tuple) else (wrapped,)
            out = list(output)
            for i, t in zip(idx, wrapped):
                out[i] = t
            return type(output)(out) if type(output) is tuple else out
        return None
    return hook


def _state_dict_hook(ref):
    def hook(module, state_dict, prefix, local_metadata):
        owner = ref()
        if owner is None:
            return
        for pname, p in module.named_parameters(recurse=False):
            if p in owner._params:
                state_dict[prefix + pname] = owner.store.get(owner._params[p][0])
    return hook


def offload(module, path, host_memory=None, capacity_bytes=None, prefetch=True, resume=False,
            verify_reads="always"):
    """Moves `module`'s parameters into a new strata store at `path` (or, with resume=True,
    takes them from the last commit of the store there) and hooks its submodules (see the
    module docstring). Returns the Offload handle (also kept as module._strata_offload).
    verify_reads: "always" checks every fetch's checksums; "once" each weight only until the
    store has seen it intact (strata.Store)."""
    handle = Offload(module, path, host_memory=host_memory, capacity_bytes=capacity_bytes,
                     prefetch=prefetch, resume=resume, verify_reads=verify_reads)
    module._strata_offload = handle
    return handle
