"""Provenance: every sequence's source and producer, through selection, concatenation,
checkpointed state and the log; no path relabels a non-native sequence as native."""

import json

import pytest
import torch

from policylab import MissingQuantityError, RolloutBatch
from policylab.batch import ProvenanceError, concat_batches, source_kind
from policylab.methods.stages.provenance import source_metrics
from policylab.trainer.runlog import RunLog, write_plots
from policylab.trainer.safestate import decode, encode

SOLVER = "solver:arithmetic"


def batch(B=4, T=3, source=(), producer=(), engine="fast-fp32", behavior_mask=None, **kw):
    P = 2
    loss_mask = torch.ones(B, T, dtype=torch.bool)
    loss_mask[0, -1] = False
    att = torch.cat([torch.ones(B, P, dtype=torch.bool), loss_mask], 1)
    fields = dict(tokens=torch.arange(B * (P + T)).view(B, P + T) % 40, attention_mask=att, loss_mask=loss_mask,
                  prompt_width=P, group=torch.tensor([0, 0, 1, 1])[:B], policy_version=torch.zeros(B, dtype=torch.long),
                  batch_id="b", source=source, producer=producer, engine=engine,
                  logp_behavior=-torch.rand(B, T) * loss_mask, behavior_mask=behavior_mask,
                  rewards=torch.tensor([1.0, 0.0, 0.5, 0.25])[:B],
                  outcome={"correct": torch.tensor([1.0, 0.0, 1.0, 0.0])[:B]})
    fields.update(kw)
    return RolloutBatch(**fields)


MIXED = dict(source=("native", "demonstration", "peer:ckpt-7", "hinted"),
             producer=("policy", SOLVER, "ckpt-7", "policy"))


def test_labels_and_producers_are_checked():
    batch(**MIXED).validate()
    assert source_kind("peer:ckpt-7") == "peer"
    with pytest.raises(ProvenanceError, match="unknown source 'teacher'"):
        batch(source=("native", "teacher", "native", "native"), producer=("policy",) * 4).validate()
    with pytest.raises(ProvenanceError, match="a peer source names its model"):
        batch(source=("native", "peer:", "native", "native"), producer=("policy", "x", "policy", "policy")).validate()
    with pytest.raises(ProvenanceError, match="must record each row's `producer`"):
        batch(source=("native", "gold", "native", "native")).validate()
    with pytest.raises(ProvenanceError, match="row 0 is native but its producer is 'ckpt-7'"):
        batch(source=("native",) * 4, producer=("ckpt-7", "policy", "policy", "policy")).validate()
    with pytest.raises(ProvenanceError, match="source 'peer:ckpt-7' but producer 'ckpt-8'"):
        batch(source=("native", "native", "peer:ckpt-7", "native"),
              producer=("policy", "policy", "ckpt-8", "policy")).validate()
    # a batch without labels is all native, produced by the learner
    b = batch().validate()
    assert b.sources == ("native",) * 4 and b.producers == ("policy",) * 4


def test_no_public_path_relabels_a_non_native_row_as_native():
    b = batch(**MIXED).validate()
    with pytest.raises(ProvenanceError, match="row 1 is 'demonstration'.*cannot be relabelled native"):
        b.replace(source=("native", "native", "peer:ckpt-7", "hinted"), producer=("policy",) * 2 + ("ckpt-7", "policy"))
    with pytest.raises(ProvenanceError, match="row 3 is 'hinted'.*cannot be relabelled native"):
        b.replace(source=("native", "demonstration", "peer:ckpt-7", "native"))
    # dropping the labels (empty = all native) is a relabel too
    with pytest.raises(ProvenanceError, match="cannot be relabelled native"):
        b.replace(source=(), producer=())
    # nor may a non-native row change kind or producer (provenance is never rewritten)
    with pytest.raises(ProvenanceError, match="row 1 is 'demonstration'.*cannot be relabelled 'gold'"):
        b.replace(source=("native", "gold", "peer:ckpt-7", "hinted"))
    with pytest.raises(ProvenanceError, match="row 2 is 'peer:ckpt-7'"):
        b.replace(producer=("policy", SOLVER, "ckpt-9", "policy"))
    # a native row keeps the learner as producer
    with pytest.raises(ProvenanceError, match="a native row keeps its producer"):
        b.replace(producer=("other", SOLVER, "ckpt-7", "policy"))
    # the one legal change: native -> another kind (it was not sampled from the deployment context)
    demoted = b.replace(source=("hinted", "demonstration", "peer:ckpt-7", "hinted")).validate()
    assert demoted.sources[0] == "hinted" and demoted.producers[0] == "policy"
    # the trainer's field writes go through replace: a stage writing `source` is refused the same way
    from policylab.methods.spec import Stage
    from policylab.trainer.rollout import apply_changes

    sneaky = Stage("reward", lambda s, c: None, name="sneaky", writes=("source",))
    with pytest.raises(ProvenanceError, match="cannot be relabelled native"):
        apply_changes(b, {"source": ("native",) * 4}, sneaky)


def test_select_and_concat_keep_every_rows_provenance():
    b = batch(**MIXED, behavior_mask=torch.tensor([[1, 1, 1], [1, 1, 1], [0, 0, 0], [1, 1, 1]], dtype=torch.bool))
    b.validate()
    s = b.select(torch.tensor([2, 0]))
    assert s.source == ("peer:ckpt-7", "native") and s.producer == ("ckpt-7", "policy")
    assert s.behavior_mask.tolist() == [[False] * 3, [True] * 3]
    native = batch(T=4)  # another engine call: no labels, no mask, other width
    demo = batch(T=2, source=("demonstration",) * 4, producer=(SOLVER,) * 4, engine="solver",
                 behavior_mask=torch.ones(4, 2, dtype=torch.bool))
    c = concat_batches([native, demo], "c").validate()
    assert c.sources == ("native",) * 4 + ("demonstration",) * 4
    assert c.producers == ("policy",) * 4 + (SOLVER,) * 4
    assert c.engine == "fast-fp32"  # the engine that sampled the native rows
    # a part without a mask is known where it counts; padding is never known
    assert c.behavior_mask.tolist()[0] == [True, True, True, False]
    assert c.behavior_mask.tolist()[4] == [True, True, False, False]
    with pytest.raises(ValueError, match="native rows sampled by different engines"):
        concat_batches([native, batch(engine="hf-fp32")], "c")


def test_behavior_logprobs_a_source_lacks_are_never_handed_out():
    known = torch.ones(4, 3, dtype=torch.bool)
    known[2] = False  # the peer row: its own tokenization differs, no per-token log-prob here
    b = batch(**MIXED, behavior_mask=known).validate()
    with pytest.raises(MissingQuantityError, match="Rows of source peer:ckpt-7 carry no behavior log-probs"):
        b.require("tis", "logp_behavior")
    b.select(torch.tensor([0, 1, 3])).require("tis", "logp_behavior")  # the others have them
    with pytest.raises(ProvenanceError, match="a native row lacks its behavior log-probs"):
        batch(behavior_mask=torch.zeros(4, 3, dtype=torch.bool)).validate()


def test_provenance_survives_checkpointed_state():
    # the stale queue of a checkpoint holds RolloutBatches: source, producer and
    # behavior_mask come back exactly (safestate: JSON + safetensors, no pickle)
    known = torch.ones(4, 3, dtype=torch.bool)
    known[2, 1:] = False
    b = batch(**MIXED, behavior_mask=known).validate()
    doc, tensors = encode({"stale_queue": [b]})
    json.dumps(doc)
    back = decode(doc, tensors)["stale_queue"][0]
    assert back.source == b.source and back.producer == b.producer
    assert torch.equal(back.behavior_mask, b.behavior_mask)
    back.validate()


def test_metrics_are_split_by_source_in_the_log_and_the_plots(tmp_path):
    b = batch(**MIXED).validate()
    _, m = source_metrics(b, None)
    # rewards [1, 0, 0.5, 0.25]: one row per source here
    assert m["reward/mean@source=demonstration"] == 0.0 and m["reward/mean@source=peer"] == 0.5
    assert m["accuracy@source=native"] == 1.0 and m["rollout/sequences@source=hinted"] == 1.0
    assert m["response/length_mean@source=native"] == 2.0  # row 0 has 2 counted tokens
    two = batch(source=("native", "gold", "native", "gold"), producer=("policy", SOLVER, "policy", SOLVER)).validate()
    _, m2 = source_metrics(two, None)
    assert m2["reward/mean@source=native"] == pytest.approx((1.0 + 0.5) / 2)
    assert m2["reward/mean@source=gold"] == pytest.approx((0.0 + 0.25) / 2)
    log = RunLog(tmp_path, tensorboard=False)
    for step in (1, 2):
        log.log(step, {"reward/mean": 0.5, **m2})
    log.close()
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["reward/mean@source=gold"] == pytest.approx(0.125)
    written = {p.name for p in write_plots(tmp_path)}
    assert "by_source.png" in written
