"""A law member's skipped-block predictions from one intact pass per chunk
(probes.experiments.law_member.SkipPredictions): on a trained tiny member of every law family,
the scores intact and with each block skipped equal those of whole passes (``predictor(model,
(block,))``), the predictions bit for bit, over more sequences than one evaluation chunk."""

from __future__ import annotations

import pytest
import torch

from depthprobe.probes.experiments.law_member import EVAL_CHUNK, SkipPredictions, predict, predictor, steps_plan
from depthprobe.probes.experiments.protocol import get_experiment
from depthprobe.probes.models.loading import load
from depthprobe.probes.training.fast_forward import fast_logits
from depthprobe.probes.training.lm import decay_adamw
from depthprobe.probes.training.loop import train_steps


def trained(family: str):
    """The deepest non-control smoke member of ``family``, trained for its 40 smoke steps."""
    exp = get_experiment(family)
    cfg = exp.config("smoke", device="cpu")
    job = max((j for j in exp.plan(cfg) if not j.control), key=lambda j: j.depth)
    model = load(job.native(), device="cpu")
    net = model.bridge.original_model
    params = [p for p in net.parameters() if p.requires_grad]
    opt = decay_adamw(net, lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    train_steps(
        net, lambda x: fast_logits(model, x), exp.source(job), opt, params, steps_plan(cfg), device=model.device
    )
    return exp, job, model


@pytest.mark.parametrize("family", ["khop", "crasp", "groups"])
def test_scores_with_each_block_skipped_equal_whole_passes(family):
    exp, job, model = trained(family)
    assert model.info.n_layers >= 2
    sets = exp.eval_sets(job, EVAL_CHUNK + 30)  # two chunks per set
    skips = SkipPredictions(model, [x for x, *_ in sets.values()])
    for block in (None, *range(model.info.n_layers)):
        whole = predictor(model, () if block is None else (block,))
        assert exp.scores(job, skips.predictor(block), sets) == exp.scores(job, whole, sets)
    assert len(skips.done) == len(sets)  # one pass set per evaluation set, read by every block


def test_predictions_bit_for_bit_and_other_inputs_as_before():
    exp, job, model = trained("crasp")
    x = next(iter(exp.eval_sets(job, EVAL_CHUNK + 5).values()))[0]
    other = x[:20].clone()
    skips = SkipPredictions(model, [x])
    decide = lambda logits: logits  # noqa: E731  (the logits themselves)
    for block in (None, 0, 1):
        skip = () if block is None else (block,)
        assert torch.equal(skips.predictor(block)(x, decide), predict(model, x, decide, skip))
        assert torch.equal(skips.predictor(block)(other), predict(model, other, skip=skip))
    assert [known is x for known, *_ in skips.done] == [True]  # the other inputs are not held
