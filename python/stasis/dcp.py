"""stasis as the storage of PyTorch's Distributed Checkpoint (DCP).

    import torch.distributed.checkpoint as dcp
    import stasis.dcp

    dcp.save(state_dict, storage_writer=stasis.dcp.Writer(job="llama", step=1200))
    dcp.async_save(state_dict, storage_writer=stasis.dcp.Writer(job="llama", step=1300))
    dcp.load(state_dict, storage_reader=stasis.dcp.Reader(job="llama"))  # the latest

Each rank writes the items DCP's planner gives it (its shards, DTensors,
replicated tensors, and the small objects DCP pickles) as its part of a
job checkpoint, through stasis's own writer (GPU tensors through its pinned
pipeline or cuFile, compressed and checksummed); DCP's coordinator then
commits the job checkpoint with DCP's metadata in it, once every rank's
part is durable: that is the commit point, as DCP's `.metadata` file is
for its file system writer. A load reads the parts the plan asks for, in
any world size: DCP's planner reshards (docs/library.md).
"""

import base64
import dataclasses
import io
import json
import pickle
import uuid

import torch
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.storage import StorageReader, StorageWriter, WriteResult
from torch.futures import Future

from . import _api, _lib, _state


@dataclasses.dataclass(frozen=True)
class Stored:
    """Where DCP's metadata finds an item: in rank's part, under name."""
    rank: int
    name: str


def _rank_world():
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _done(value):
    fut = Future()
    fut.set_result(value)
    return fut


class Writer(StorageWriter):
    """DCP's StorageWriter over a stasis store: dcp.save(...,
    storage_writer=Writer(job=..., step=...)). attempt: the key the ranks
    of this save share (default: one the coordinator draws and DCP's plan
    hands to every rank). part_timeout: how long the coordinator waits for
    the ranks' parts (seconds).

    With dcp.async_save it is also the stager (DCP's AsyncStager): the
    state is copied into pinned host memory kept for the next save of a
    state shaped the same (allocated at the first one), at the bus's
    speed, and the background write takes it from there. Keep one Writer
    for the saves of a training run to reuse that memory (stage=False
    leaves the staging to DCP's default, pageable and allocated each
    time)."""

    def __init__(self, job, step, home=None, attempt=None, compress=None, part_timeout=600, stage=True):
        self.job, self.step = job, _lib.check_step(step)
        _lib.encode_job(job)
        self.home, self.attempt, self.compress, self.part_timeout = home, attempt, compress, part_timeout
        self.is_coordinator = False
        self._stage, self._staged = stage, None

    # DCP's AsyncStager protocol (torch.distributed.checkpoint.staging).
    _synchronize_after_execute = False

    @property
    def should_synchronize_after_execute(self):
        return False

    def stage(self, state_dict):
        """Copies state_dict into the pinned host copy kept for this writer
        (DTensors and sharded tensors as their local shards, by torch's own
        state-dict helpers) and returns it, once the copies are done."""
        from torch.distributed import _state_dict_utils as sdu
        if not self._stage:
            return sdu._copy_state_dict(state_dict, sdu._create_cpu_state_dict(state_dict), type_check=False)
        if self._staged is None:
            self._staged = sdu._create_cpu_state_dict(state_dict, pin_memory=True)
        staged = sdu._copy_state_dict(state_dict, self._staged, non_blocking=True, type_check=False)
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return staged

    def synchronize_staging(self):
        pass

    def close(self):
        self._staged = None

    def for_step(self, step):
        """This writer for another step, keeping its staging memory: the
        writer a training loop passes to the next save."""
        self.step = _lib.check_step(step)
        return self

    def reset(self, checkpoint_id=None):
        pass

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.is_coordinator = is_coordinator

    init = set_up_storage_writer  # DCP before 2.3

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        # Runs on the coordinator, which keeps the attempt for finish.
        self._plan_attempt = self.attempt or uuid.uuid4().hex
        return [dataclasses.replace(p, storage_data=self._plan_attempt) for p in plans]

    def write_data(self, plan, planner):
        rank, world = _rank_world()
        tensors, blobs, results = {}, {}, []
        for i, item in enumerate(plan.items):
            name = "i%d" % i
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                raw = data.getvalue() if isinstance(data, io.BytesIO) else bytes(data)
                blobs[name] = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
                size = len(raw)
            else:
                t = data.detach()
                tensors[name] = t if t.is_contiguous() else t.contiguous()
                size = t.numel() * t.element_size()
            results.append(WriteResult(index=item.index, size_in_bytes=size, storage_data=Stored(rank, name)))
        _api.save({"tensors": tensors, "bytes": blobs}, self.job, self.step, blocking=True, home=self.home,
                  compress=self.compress, rank=rank, world_size=world, attempt=plan.storage_data,
                  _no_commit=True)
        return _done(results)

    def finish(self, metadata, results):
        metadata.storage_data = {wr.index: wr.storage_data for rank_results in results for wr in rank_results}
        _, world = _rank_world()
        app = json.dumps({"dcp_metadata": base64.b64encode(pickle.dumps(metadata)).decode("ascii")})
        # Every rank saved its part under the plan's attempt.
        attempt = self._plan_attempt
        s = _lib.store(self.home)
        timeout_ms = max(1, int(self.part_timeout * 1000))
        _lib.call_json(_lib.lib().stasis_commit_job, s.handle, _lib.encode_job(self.job), self.step, world,
                       attempt.encode("utf-8"), timeout_ms, app.encode("utf-8"))

    def storage_meta(self):
        return None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return False


class Reader(StorageReader):
    """DCP's StorageReader over a stasis store: dcp.load(state_dict,
    storage_reader=Reader(job=...)) loads job's latest complete job
    checkpoint (or the one at step) into any world size."""

    def __init__(self, job, step=None, home=None):
        _lib.encode_job(job)
        self.job, self.step, self.home = job, step, home
        self.parts, self.storage_data = None, None

    def reset(self, checkpoint_id=None):
        pass

    def read_metadata(self):
        s = _lib.store(self.home)
        info = _lib.call_json(_lib.lib().stasis_job, s.handle, _lib.encode_job(self.job),
                              -1 if self.step is None else _lib.check_step(self.step))
        app = info.get("app") or {}
        if "dcp_metadata" not in app:
            raise _lib.InvalidArgument(2, f"job checkpoint {info['id']} was not saved through stasis.dcp")
        self.parts = {p["rank"]: p["id"] for p in info["parts"]}
        metadata = pickle.loads(base64.b64decode(app["dcp_metadata"]))
        self.storage_data = metadata.storage_data
        return metadata

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        self.storage_data = metadata.storage_data

    init = set_up_storage_reader  # DCP before 2.3

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        if self.parts is None:
            self.read_metadata()
        by_rank = {}
        for item in plan.items:
            by_rank.setdefault(self.storage_data[item.storage_index].rank, []).append(item)
        for rank, items in sorted(by_rank.items()):
            self._read_part(self.parts[rank], items, planner)
        return _done(None)

    def _read_part(self, part_id, items, planner):
        """Loads what items ask of one part: a tensor an item takes whole,
        into a destination of its dtype and shape, straight into it (on the
        GPU through stasis's own path); the rest (a slice for a reshard,
        DCP's pickled objects, what no item asks for) into host memory."""
        s = _lib.store(self.home)
        info = _api._find(s, None, None, part_id)
        nodes = {tuple(path): node for path, node in _state.tensor_nodes(info["state"]["tree"])}
        asked = {}
        for item in items:
            asked.setdefault(self.storage_data[item.storage_index].name, []).append(item)
        into, direct = {"tensors": {}, "bytes": {}}, []
        for (kind, name), node in nodes.items():
            target = None
            its = asked.get(name, [])
            if kind == "tensors" and len(its) == 1 and its[0].type != LoadItemType.BYTE_IO:
                item = its[0]
                dst = planner.resolve_tensor(item).detach()
                whole = all(o == 0 for o in item.storage_offsets) and list(item.lengths) == node["shape"]
                if whole and dst.is_contiguous() and list(dst.shape) == node["shape"] and \
                        str(dst.dtype).replace("torch.", "") == node["type"]:
                    target = dst
                    direct.append((item, dst))
            into[kind][name] = target if target is not None else _api._allocate(node, "cpu")
        _api.load(id=part_id, home=self.home, into=into)
        done = {id(item) for item, _ in direct}
        for item, dst in direct:
            planner.commit_tensor(item, dst)
        for item in items:
            if id(item) in done:
                continue
            name = self.storage_data[item.storage_index].name
            if item.type == LoadItemType.BYTE_IO:
                planner.load_bytes(item, io.BytesIO(into["bytes"][name].numpy().tobytes()))
                continue
            src = into["tensors"][name]
            for dim, (off, length) in enumerate(zip(item.storage_offsets, item.lengths)):
                src = src.narrow(dim, off, length)
            dst = planner.resolve_tensor(item).detach()
            dst.copy_(src)
            planner.commit_tensor(item, dst)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return False
