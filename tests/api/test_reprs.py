"""Short reprs: a Model and a Result print as one line (name, task, sizes), not a module dump or
the attention patterns as float lists."""

from depthprobe.probes import load
from depthprobe.probes.api.run import run

NATIVE = "native:layers=2,d_model=16,heads=4,d_vocab=40,n_ctx=64,seed=3"


def test_model_repr_is_one_line_with_name_and_sizes(tiny_bert):
    text = repr(tiny_bert)
    assert "\n" not in text and len(text) < 200, text
    assert text.startswith("Model(") and tiny_bert.name in text
    assert "encoder, 2 layers x 4 heads, d_model 32, max_len 64, cpu" in text
    native = repr(load(NATIVE))
    assert "\n" not in native and "decoder, 2 layers x 4 heads, d_model 16" in native


def test_result_repr_is_one_line_with_task_model_and_sizes(tiny_bert, tmp_path):
    r = run(tiny_bert, "coref", views=4)
    assert r.views  # attention patterns as float lists: what the repr used to print
    text = repr(r)
    assert "\n" not in text and len(text) < 300, text[:500]
    assert f"task='coref', model={tiny_bert.name!r}, scores {len(r.scores)} rows" in text
    assert f"{len(r.views)} views" in text
    r.save(tmp_path / "run")
    assert repr(r).endswith(f"saved to {tmp_path / 'run'})")


def test_trained_repr_is_one_line_without_the_loss_rows(tmp_path):
    """D8: repr(Trained) listed every logged loss row."""
    from depthprobe.probes import train

    done = train(layers=1, d_model=16, heads=2, vocab=16, seq_len=16, steps=40, log_every=1, batch_size=4)
    text = repr(done)
    assert "\n" not in text and len(text) < 200, text[:500]
    assert text.startswith(f"Trained({done.model.name!r}, step 40, loss {done.losses[-1]['loss']:.4f}, 40 loss rows")
    assert text.endswith(", in memory)")
