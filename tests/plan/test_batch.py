"""The default global batch (genconf.batch): published batches reproduced at their sizes, monotone in between,
0.25M-16M tokens above 1B, and a smoke-sized model gets a smoke-sized batch."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from genconf.plan.batch import (ANCHORS, MI, SMOKE_MAX_MICROBATCHES, default_batch, default_tokens_per_step,
                           global_batch_for)

# Published batches in tokens per step (the papers' M is 2^20: GPT-3's 0.5M is 256 sequences of 2048 tokens).
PUBLISHED = [
    (125e6, 256 * 2048),  # GPT-3 Small (Brown et al. 2020, Table 2.1)
    (760e6, 256 * 2048),  # GPT-3 Large
    (1.3e9, 512 * 2048),  # GPT-3 XL
    (6.74e9, 1024 * 4096),  # Llama-2 7B (Touvron et al. 2023b, Sec. 2.2)
    (69e9, 1024 * 4096),  # Llama-2 70B
    (405e9, 2048 * 8192),  # Llama-3 405B, final stage (Dubey et al. 2024, Sec. 3.4.1)
]


@pytest.mark.parametrize("params,tokens", PUBLISHED)
def test_published_batches_are_reproduced_at_their_sizes(params, tokens):
    assert default_tokens_per_step(params)[0] == tokens


def test_anchors_are_sorted_and_never_shrink():
    sizes = [a.params for a in ANCHORS]
    assert sizes == sorted(sizes)
    assert [a.tokens_per_step for a in ANCHORS] == sorted(a.tokens_per_step for a in ANCHORS)


@given(st.floats(1e3, 1e13), st.floats(1.0, 2.0))
def test_a_larger_model_never_gets_a_smaller_batch(params, factor):
    assert default_tokens_per_step(params * factor)[0] >= default_tokens_per_step(params)[0]


@given(st.floats(1e9, 1e14))
def test_models_above_1b_get_025m_to_16m_tokens(params):
    tokens, reason, smoke = default_tokens_per_step(params)
    assert 0.25 * MI <= tokens <= 16 * MI and not smoke and reason


def test_between_anchors_the_batch_is_log_interpolated():
    # OLMo-1B (1,176,764,416 parameters) sits between GPT-3 Large (0.5M) and XL (1M): the geometric interpolation.
    tokens, reason, _ = default_tokens_per_step(1_176_764_416)
    import math

    x = math.log(1_176_764_416 / 760e6) / math.log(1.3e9 / 760e6)
    assert tokens == round(0.5 * MI * 2**x) and 0.5 * MI < tokens < MI
    assert "GPT-3 Large" in reason and "GPT-3 XL" in reason
    # Llama-3 8B sits on the flat 4M stretch (Llama-2 7B to 70B); at 8192 tokens a sequence that is 512 sequences
    assert default_batch(8_030_261_248, 8192).sequences == 512


def test_the_issue_smoke_model_gets_a_smoke_sized_batch():
    # issue 14: a 174K-parameter model at seq 128 on 2 GPUs was given 32,768 sequences, 2,048 micro-batches a step.
    target = default_batch(174_000, 128)
    assert target.smoke and target.sequences < 64
    gbs = global_batch_for(target, unit=2, microbatch_sequences=2)  # mbs 1 x dp 2
    assert gbs // 2 <= SMOKE_MAX_MICROBATCHES and gbs == 56


@given(params=st.floats(1e3, 124e6), seq=st.sampled_from([16, 64, 128, 512, 2048]), mbs=st.sampled_from([1, 2, 4, 8]),
       dp=st.integers(1, 64), pp=st.sampled_from([1, 2, 4]))
def test_a_smoke_sized_model_never_gets_more_than_64_microbatches(params, seq, mbs, dp, pp):
    unit = mbs * dp * pp  # interleaved schedules want the micro-batches in multiples of pp
    gbs = global_batch_for(default_batch(params, seq), unit, microbatch_sequences=mbs * dp)
    assert gbs % unit == 0 and gbs >= unit
    assert gbs // (mbs * dp) <= max(SMOKE_MAX_MICROBATCHES, pp)


@given(params=st.floats(125e6, 1e13), seq=st.sampled_from([2048, 4096, 8192]), unit=st.integers(1, 4096))
def test_the_global_batch_is_the_target_rounded_to_the_layout(params, seq, unit):
    target = default_batch(params, seq)
    gbs = global_batch_for(target, unit, microbatch_sequences=unit)
    assert gbs % unit == 0 and abs(gbs - target.sequences) <= max(unit / 2, unit - target.sequences)


def test_bad_input_is_a_value_error():
    with pytest.raises(ValueError, match="params must be positive"):
        default_tokens_per_step(0)
    with pytest.raises(ValueError, match="seq_length must be positive"):
        default_batch(1e9, 0)
