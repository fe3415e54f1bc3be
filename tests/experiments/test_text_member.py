"""A text study's member (probes/experiments/text_member.py): the job counts, builds, trains and
saves itself, as a native decoder (levine, petty: :class:`TextJob`) or as the depth-study network
(spa: :class:`VariantJob`), and the family says which (``Experiment.Job``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from depthprobe import probes
from depthprobe.probes.data import corpus as corpora
from depthprobe.probes.experiments.protocol import get_experiment
from depthprobe.probes.experiments.spa import VariantJob
from depthprobe.probes.experiments.text_member import TextJob
from depthprobe.probes.models.families import count_params
from depthprobe.probes.training import lm
from tests.helpers import plan, resolve

SHAKESPEARE = Path(__file__).resolve().parents[2] / "tasks" / "data" / "tinyshakespeare.txt"
SMALL = {"vocab": 300, "context": 32}  # 8 x 32 tokens a step (the smoke preset's batch)


def petty_job(**given) -> TextJob:
    """The smoke preset's depth-2 petty member: d_model 16, 2 heads of 8, d_ff 55 (budget 6000)."""
    return plan(resolve("petty", "smoke", **SMALL, **given))[1]


def spa_jobs(**given) -> list[VariantJob]:
    """The smoke preset's spa members: pre-ln and e-spa, depth 2, width 16, attention-only."""
    return plan(resolve("spa", "smoke", **SMALL, **given))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> corpora.Corpus:
    path = tmp_path_factory.mktemp("corpus") / "plays.txt"
    path.write_text(SHAKESPEARE.read_text(encoding="utf-8")[:60_000], encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DEPTHPROBE_CACHE", str(tmp_path_factory.mktemp("cache")))
        return corpora.load_corpus(str(path), vocab=SMALL["vocab"])


def test_the_family_says_which_member_it_plans():
    assert get_experiment("petty").Job is TextJob and get_experiment("levine").Job is TextJob
    assert get_experiment("spa").Job is VariantJob
    assert type(petty_job()) is TextJob and all(type(j) is VariantJob for j in spa_jobs())


def test_a_native_member_counts_itself_without_building():
    """Per block: W_Q, W_K, W_V, W_O 4 * 16 * 16 = 1024 and their biases 4 * 16; the MLP 16 * 55 + 55
    + 55 * 16 + 16 = 1831; two LayerNorms 64: 2983; two blocks and the final LayerNorm: 5998.
    Embeddings: tokens 300 * 16, positions 32 * 16, unembedding 16 * 300: 10112."""
    job = petty_job()
    assert (job.member.depth, job.member.d_ff) == (2, 55)
    assert job.sizes(300) == (5998, 10112)
    assert job.counted(300) == (5998, 10112)
    assert job.net_config(300).n_params() == 16110  # the count --max-params sees
    assert count_params(job.network(300, "cpu")) == (5998, 10112)  # the built model agrees


def test_a_variant_member_is_counted_on_its_built_network():
    """Attention-only, no positions: 2 blocks of W_Q, W_K, W_V, W_O (4 * 16 * 16) = 2048, and pre-ln's
    two LayerNorms a block (gain and bias, 2 * 2 * 2 * 16 = 64) on top; embeddings 300 * 16 twice."""
    pre_ln, espa = spa_jobs()
    assert pre_ln.sizes(300) is None and espa.sizes(300) is None
    assert pre_ln.counted(300) == (2112, 9600) and espa.counted(300) == (2048, 9600)
    assert (pre_ln.net_config(300).n_params(), espa.net_config(300).n_params()) == (11712, 11648)


def test_a_variant_member_builds_with_the_study_gamma():
    (_, espa) = spa_jobs(gamma_last=0.1116)
    assert espa.net_config(300).gamma_last == 0.1116
    net = espa.network(300, "cpu")
    assert net.bridge.cfg.gamma_last == 0.1116 and net.info.name == espa.name == "spa-e-spa-w016-L02-s0"


def test_tokens_and_size_columns():
    """Tokens: 5 per parameter of the 6000 budget, rounded up to whole steps of 256 (30,208), or the
    floor (65,536); spa (no budget): for the shared matrices, 4 * 16 * 16 * 2 = 2048 -> 10,240 -> 10,240."""
    assert petty_job(min_tokens=1).tokens == 30_208 and petty_job().tokens == 65_536
    assert spa_jobs(min_tokens=1)[0].tokens == 10_240
    cols = petty_job().size_columns(5998, 10112)
    assert cols["params_total"] == 16110 and cols["budget_miss"] == pytest.approx(-2 / 6000)
    assert cols["embed_share"] == pytest.approx(10112 / 16110) and cols["match"] == "nonembed"
    assert "budget_miss" not in spa_jobs()[0].size_columns(2112, 9600)


def test_each_member_trains_through_its_own_path(corpus):
    """The native member trains through the fast path, which gives the bridge's own logits; the
    variant network is called directly."""
    job = petty_job()
    model = job.build(corpus, "cpu")
    net = job.trainable(model)
    assert net.module is model.bridge.original_model
    tokens = torch.randint(0, corpus.vocab, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(net.logits(tokens), model.bridge(tokens), rtol=1e-4, atol=1e-5)
    spa = spa_jobs()[1]
    direct = spa.trainable(spa.build(corpus, "cpu"))
    assert direct.module is direct.model.bridge
    with pytest.raises(probes.ProbeError, match="not a native model"):
        lm.native(direct.model)


@pytest.mark.parametrize("which", ["native", "variant"])
def test_a_saved_member_reloads_with_its_weights_tokenizer_and_stamp(which, corpus, tmp_path):
    job = petty_job() if which == "native" else spa_jobs()[1]
    model = job.build(corpus, "cpu")
    job.save(model, corpus, tmp_path / "checkpoint")
    again = probes.load(str(tmp_path / "checkpoint"), device="cpu")
    tokens = torch.randint(0, corpus.vocab, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(job.trainable(again).logits(tokens), job.trainable(model).logits(tokens))
    assert again.tokenizer.decode(again.tokenizer("To be, or not to be")["input_ids"]) == "To be, or not to be"
    meta = json.loads((tmp_path / "checkpoint" / "depthprobe.json").read_text())
    assert meta["study"] == {"member": job.name, "family": job.member.family, "corpus": corpus.label}


def test_the_family_gives_its_expectation_member_note_and_id_columns():
    """What the shared page and depth tables used to know per family, each text family says."""
    import pandas as pd

    from depthprobe.probes.experiments.member_depth import with_member_columns
    from depthprobe.probes.render.study import study_page

    petty, spa = get_experiment("petty"), get_experiment("spa")
    assert "Petty et al." in petty.prediction and "He et al." in spa.prediction
    members = pd.DataFrame(
        [{"member": "m", "variant": "pre-ln", "group": "g", "depth": 2, "seed": 0, "status": "ok", "error": ""}]
    )
    table = with_member_columns(pd.DataFrame({"member": ["m"], "layer": [0]}), members, petty.id_columns)
    assert list(table.columns) == ["member", "variant", "depth", "seed", "layer"]  # no group: not a text column
    page = study_page("petty", "smoke", members, [], {}, members_note=petty.members_note)
    assert "embed_share: the embedding part" in page
    assert "embed_share: the embedding part" not in study_page("petty", "smoke", members, [], {})
