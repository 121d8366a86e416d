"""Hugging Face config.json import: exact parameter counts of the public checkpoints, the fields that are mapped,
the catalog YAML it writes, and refusals as one line with exit 2."""

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from conftest import REPO, genconf_cmd, mcore_cpu_script, needs_megatron, needs_torch
from genconf.catalog import hf
from genconf.catalog.models import MODEL_KEYS, architecture, model_from_file, resolve_model
from genconf.cli.main import main
from genconf.plan.errors import GenconfError
from genconf.plan.counting import active_param_count, exact_param_count, layer_tensors

HF = REPO / "tests" / "data" / "hf"

# Parameters of the released checkpoints (tests/data/hf/README.md names the config.json sources). "HF total" is the
# `safetensors.total` the Hugging Face Hub computes from the checkpoint's tensor shapes (shown as "Model size" on
# the model page); where a checkpoint also stores buffers, the count is that of the parameters and says so.
PUBLIC_COUNTS = {
    "llama3-8b": 8_030_261_248,         # HF total, meta-llama/Meta-Llama-3-8B
    "llama3.2-1b": 1_235_814_400,       # HF total, meta-llama/Llama-3.2-1B (lm_head tied: stored once)
    "llama3.2-3b": 3_212_749_824,       # HF total, meta-llama/Llama-3.2-3B (lm_head tied: stored once)
    "llama3.1-8b": 8_030_261_248,       # HF total, meta-llama/Llama-3.1-8B
    "llama3.1-70b": 70_553_706_496,     # HF total, meta-llama/Llama-3.1-70B
    "mistral-7b-v0.1": 7_241_732_096,   # HF total, mistralai/Mistral-7B-v0.1
    "mixtral-8x7b-v0.1": 46_702_792_704,  # HF total, mistralai/Mixtral-8x7B-v0.1
    "qwen2-7b": 7_615_616_512,          # HF total, Qwen/Qwen2-7B ("7.62B")
    "qwen2-0.5b": 494_032_768,          # HF total, Qwen/Qwen2-0.5B (tied)
    "qwen3-8b": 8_190_735_360,          # HF total, Qwen/Qwen3-8B ("8.19B")
    "qwen3-30b-a3b": 30_532_122_624,    # HF total, Qwen/Qwen3-30B-A3B ("30.5B in total")
    "olmo-1b-hf": 1_176_764_416,        # HF total, allenai/OLMo-1B-hf (= the catalog's olmo-1b)
    "olmo-2-1124-7b": 7_298_617_344,    # HF total (F32), allenai/OLMo-2-1124-7B
    # GPT-2 small: 124,439,808 parameters with the lm_head tied to wte (sum(p.numel()) of GPT2LMHeadModel, the
    # "124M"); the Hub's 137M also counts the twelve 1024 x 1024 causal-mask buffers stored as attn.bias.
    "gpt2": 124_439_808,
    # Pythia README (EleutherAI/pythia, model table): 160M has 162,322,944 total and 85,056,000 non-embedding
    # parameters; the Hub's 213M also counts the stored 2048 x 2048 attention-mask buffers.
    "pythia-160m": 162_322_944,
    "gemma-2b": 2_506_172_416,          # HF total, google/gemma-2b; KerasHub preset gemma_2b_en "params"
    "gemma-7b": 8_537_680_896,          # HF total, google/gemma-7b; KerasHub preset gemma_7b_en "params"
    "gemma-2-2b": 2_614_341_888,        # HF total, google/gemma-2-2b
    "gemma-2-9b": 9_241_705_984,        # HF total, google/gemma-2-9b; KerasHub preset gemma2_9b_en "params"
    "gemma-2-27b": 27_227_128_320,      # HF total, google/gemma-2-27b ("27.2B")
    "gemma-3-1b": 999_885_952,          # HF total, google/gemma-3-1b-it; KerasHub preset gemma3_1b "params"
    # Qwen2.5 model card: 0.49B, 0.36B non-embedding; the tensor shapes of Qwen2-0.5B, HF total 494,032,768. Its
    # config.json writes `use_mrope: false`, as the Qwen2.5 and DeepSeek-R1-Distill-Qwen configs do.
    "qwen2.5-0.5b": 494_032_768,
    "mistral-nemo-base-2407": 12_247_782_400,  # HF total, mistralai/Mistral-Nemo-Base-2407 ("12.2B"); head_dim 128
    # KerasHub preset gemma3_270m "params" (270M = 170M embedding + 100M transformer, the model card); transformers
    # 4.55's config: layer_types listed, _sliding_window_pattern, use_bidirectional_attention false.
    "gemma-3-270m": 268_098_176,
    # openai/gpt-oss-120b: 116,829,156,672 summed over the checkpoint's tensor shapes (gminneci/mantile
    # backend/data/model_configs/openai_GPT-OSS-120B.json total_params, "via HF AutoConfig and dry-run tensor
    # inspection"; the model card's Table 1: 116.83B; the Hub's own total counts the packed MXFP4 bytes instead).
    "gpt-oss-120b": 116_829_156_672,
    # openai/gpt-oss-20b: 20,914,757,184 summed over the checkpoint's tensor shapes, MXFP4 blocks as two parameters a
    # byte and their scales left out (huggingface/huggingface.js packages/hub/src/lib/parse-safetensors-metadata.spec.ts
    # at commit 00d37b2d311335bdb3a8331503cc0b162a1e2926, "fetch info for openai/gpt-oss-20b": BF16 1,804,459,584 + U8
    # 19,110,297,600; the same test file gives the 120b's 116,829,156,672); the model card's Table 1: 20.91B.
    "gpt-oss-20b": 20_914_757_184,
    # microsoft/Phi-3-mini-4k-instruct: model.safetensors.index.json total_size 7,642,159,104 bytes / 2 (BF16); fused
    # qkv_proj and gate_up_proj hold llama's q/k/v and gate/up counts; sliding_window 2047 on every layer.
    "phi-3-mini-4k-instruct": 3_821_079_552,
    # Qwen/Qwen1.5-MoE-A2.7B: model.safetensors.index.json total_size 28,631,568,384 bytes / 2 (BF16); KerasHub preset
    # qwen1.5_moe_2.7b_en "params" 14,315,784,192. Its 24 shared_expert_gate vectors (2,048 each) are in the count.
    "qwen1.5-moe-a2.7b": 14_315_784_192,
    # deepseek-ai/DeepSeek-V2-Lite: model.safetensors.index.json total_size 31,412,968,448 bytes / 2 (BF16), as public
    # notes on the checkpoint quote it (the Hub's "15.7B"); megatron-core's meta-device build of the import has as many
    # (test_megatron_core_builds_deepseek_v2_with_the_published_counts). No query latent (q_lora_rank null).
    "deepseek-v2-lite": 15_706_484_224,
    # deepseek-ai/DeepSeek-V2 ("236B"): its -Chat-0628 fine-tune's model.safetensors.index.json total_size
    # 471,482,869,760 bytes / 2 (BF16), as a public walk-through of its 55 shards quotes it; megatron-core's
    # meta-device build of the import has as many.
    "deepseek-v2": 235_741_434_880,
}

UNCOUNTED = {"gpt-oss-120b": 36 * 64, "gpt-oss-20b": 24 * 64}
"""Checkpoint parameters genconf does not count, per published count: gpt-oss's attention sinks (64 heads) in each of
its 36 or 24 layers, which Megatron-LM has no flag for (said in the import's notes)."""

MAIN_MODEL_COUNTS = {
    # DeepSeek-V3's main model without its MTP module: 671,026,419,200 (tests/plan/test_mla.py; "Total parameters:
    # 671B" in DeepSeek-V3's README_WEIGHTS.md), with e_score_correction_bias, 256 in each of its 58 MoE layers,
    # which megatron-core keeps as a buffer (expert_bias).
    "deepseek-v3": 671_026_419_200 - 58 * 256,
}
"""Configs whose published count is the main model's, without its multi-token-prediction layers."""

TEXT_DECODER_COUNTS = {
    # Llama 4 Maverick and Scout (Llama4ForConditionalGeneration): the import plans the text decoder of a checkpoint
    # that holds a vision encoder too. Meta publishes no exact count, only "400B" / "109B" total and "17B" active (the
    # model cards; test_llama4_text_decoders_are_the_cards_totals_less_the_vision_tower); these are the counts of
    # models/llama4-maverick.yaml and llama4-scout.yaml, which megatron-core's meta-device build of the import has
    # (test_megatron_core_builds_llama4_s_text_decoders). Maverick: 24 x (dense layer 314,583,040 + MoE layer
    # 16,295,536,640) + 2 x 202,048 x 5120 + 5120; Scout: 48 MoE layers of 2,202,101,760 + the same ends.
    "llama-4-maverick-17b-128e-instruct": 400_711_848_960,
    "llama-4-scout-17b-16e-instruct": 107_769_861_120,
}
"""Vision-language configs whose count is their text decoder's (the import notes the vision tower it leaves out)."""

PLANNED_COUNTS = PUBLIC_COUNTS | TEXT_DECODER_COUNTS

PLAN_GPUS = {"llama-4-maverick-17b-128e-instruct": 128}
"""GPUs test_plan_from_a_config_json plans on where 64 H100s are too few (Maverick's 400B: 102.8 GiB a GPU at best)."""


def load(name):
    return hf.model_from_hf(HF / name / "config.json")


def test_every_stored_config_has_a_published_count():
    assert sorted(p.name for p in HF.iterdir() if p.is_dir()) == sorted(PLANNED_COUNTS | MAIN_MODEL_COUNTS)


@pytest.mark.parametrize("name,count", sorted(PUBLIC_COUNTS.items()))
def test_exact_count_equals_the_published_checkpoint(name, count):
    assert exact_param_count(load(name).spec) + UNCOUNTED.get(name, 0) == count


@pytest.mark.parametrize("name,count", sorted(MAIN_MODEL_COUNTS.items()))
def test_main_model_count_equals_the_published_checkpoint(name, count):
    spec = load(name).spec
    assert spec.mtp_num_layers == 1 and exact_param_count(dataclasses.replace(spec, mtp_num_layers=0)) == count


def test_pythia_non_embedding_count():
    spec = load("pythia-160m").spec
    assert exact_param_count(spec) - 2 * spec.vocab_size * spec.hidden_size == 85_056_000  # Pythia README


def test_moe_active_parameters():
    # Qwen3 model card: "30.5B in total and 3.3B activated" (8 of 128 experts; the card truncates 3.35B).
    assert 3.3e9 <= active_param_count(load("qwen3-30b-a3b").spec) < 3.4e9


def test_same_model_as_the_hand_written_catalog_entries():
    for hf_name, catalog in (("llama3-8b", "llama3-8b"), ("mixtral-8x7b-v0.1", "mixtral-8x7b"),
                             ("olmo-1b-hf", "olmo-1b"), ("olmo-2-1124-7b", "olmo2-7b")):
        imported, (written, _) = load(hf_name).spec, resolve_model(catalog)
        assert imported.num_experts == written.num_experts and imported.qk_layernorm == written.qk_layernorm
        assert imported.normalization == written.normalization and imported.tie_embeddings == written.tie_embeddings
        assert exact_param_count(imported) == exact_param_count(written), hf_name


def _tensor(spec, name):
    return {t.name: t.numel for t in layer_tensors(spec)}.get(name)


def test_fields_are_mapped():
    llama = load("llama3-8b").spec
    assert (llama.num_query_groups, llama.activation, llama.normalization, llama.tie_embeddings) == (8, "swiglu", "rmsnorm", False)
    assert llama.seq_length == 8192 and not llama.add_bias_linear and llama.hidden_dropout == 0.0
    small = load("llama3.2-1b")
    assert small.spec.tie_embeddings and small.spec.seq_length == 8192  # rope scaling's pre-training context
    assert any("131,072" in n for n in small.notes)
    gemma = load("gemma-7b").spec  # head_dim 256 x 16 heads = 4096 wider than hidden 3072; tied by default
    assert gemma.kv_channels == 256 and gemma.query_width == 4096 and gemma.tie_embeddings
    assert load("gemma-2b").spec.num_query_groups == 1  # multi-query attention
    qwen2 = load("qwen2-7b").spec  # bias on q, k, v only
    assert _tensor(qwen2, "self_attention.linear_qkv.bias") == 3584 + 2 * 512
    assert _tensor(qwen2, "self_attention.linear_proj.bias") is None and _tensor(qwen2, "mlp.linear_fc1.bias") is None
    qwen3 = load("qwen3-8b").spec  # per-head q/k RMSNorm
    assert _tensor(qwen3, "self_attention.q_layernorm.weight") == _tensor(qwen3, "self_attention.k_layernorm.weight") == 128
    olmo2 = load("olmo-2-1124-7b").spec  # full-width q/k RMSNorm
    assert _tensor(olmo2, "self_attention.q_layernorm.weight") == _tensor(olmo2, "self_attention.k_layernorm.weight") == 4096
    assert load("olmo-1b-hf").spec.normalization == "nonparametric"
    gemma2 = load("gemma-2-2b")
    assert gemma2.spec.sandwich_norm and _tensor(gemma2.spec, "post_mlp_layernorm.weight") == 2304
    assert any("soft-capping" in n for n in gemma2.notes)
    assert (gemma2.spec.sliding_window, gemma2.spec.window_attn_skip_freq) == (4096, 2)  # layers 1, 3, 5, ...
    gpt2 = load("gpt2").spec
    assert (gpt2.position_embedding, gpt2.normalization, gpt2.norm_bias, gpt2.add_bias_linear, gpt2.tie_embeddings,
            gpt2.hidden_dropout, gpt2.ffn_hidden_size) == ("learned", "layernorm", True, True, True, 0.1, 3072)
    neox = load("pythia-160m")
    assert neox.spec.position_embedding == "rope" and not neox.spec.tie_embeddings and neox.spec.add_bias_linear
    assert neox.spec.rotary_percent == 0.25 and any("parallel" in n for n in neox.notes)  # rendered, not noted
    moe = load("qwen3-30b-a3b").spec
    assert (moe.num_experts, moe.moe_top_k, moe.moe_ffn_hidden_size, moe.qk_layernorm_per_head) == (128, 8, 768, True)
    mixtral = load("mixtral-8x7b-v0.1").spec
    assert (mixtral.num_experts, mixtral.moe_top_k, mixtral.moe_ffn_hidden_size) == (8, 2, 14336)
    gemma3 = load("gemma-3-1b")  # per-head q/k norms, sandwich norms, every 6th layer full attention
    assert (gemma3.spec.qk_layernorm_per_head, gemma3.spec.sandwich_norm) == (True, True)
    assert (gemma3.spec.sliding_window, gemma3.spec.window_attn_skip_freq, gemma3.spec.windowed_layers) == (512, 6, 22)
    mistral = load("mistral-7b-v0.1")
    assert (mistral.spec.sliding_window, mistral.spec.window_attn_skip_freq, mistral.spec.unmodelled) == (4096, 0, ())
    assert load("qwen2-7b").spec.sliding_window is None  # use_sliding_window: false


def _windowed(**fields) -> tuple:
    config = json.loads((HF / "qwen2-0.5b" / "config.json").read_text()) | fields
    spec, _, _ = hf.model_from_config(config, name="windowed", where="config.json")
    return spec.sliding_window, spec.window_attn_skip_freq, spec.unmodelled


def test_sliding_windows_are_read_as_megatron_core_lays_them():
    """Which layers use the window: transformers' layer_types, Qwen2's max_window_layers (layers from it on) or
    every layer, as megatron-core's window_size and window_attn_skip_freq (layer n windowed unless n % freq == 0);
    a pattern those cannot express is said and priced as full attention."""
    sliding, full = "sliding_attention", "full_attention"
    assert _windowed(use_sliding_window=True, sliding_window=4096, max_window_layers=0) == (4096, 0, ())
    assert _windowed(use_sliding_window=True, sliding_window=4096, max_window_layers=24)[:2] == (None, 0)
    assert _windowed(use_sliding_window=True, sliding_window=512, layer_types=[sliding, sliding, full] * 8) == (512, 3, ())
    assert _windowed(use_sliding_window=True, sliding_window=512, layer_types=[full] * 24)[:2] == (None, 0)
    window, freq, notes = _windowed(use_sliding_window=True, sliding_window=4096, max_window_layers=20)
    assert (window, freq) == (None, 0) and any("4 of 24 layers" in n and "upper bound" in n for n in notes)
    assert _windowed(use_sliding_window=False, sliding_window=4096, max_window_layers=0)[:2] == (None, 0)
    # Absent keys take the transformers config class's defaults: Qwen2's max_window_layers 28 (of 24 here: none).
    config = json.loads((HF / "qwen2-0.5b" / "config.json").read_text()) | {"use_sliding_window": True}
    config.pop("max_window_layers")
    assert hf.model_from_config(config, name="q", where="config.json")[0].sliding_window is None
    with pytest.raises(GenconfError, match="layer_types"):
        _windowed(use_sliding_window=True, sliding_window=512, layer_types=[sliding] * 23)
    with pytest.raises(GenconfError, match="layer_types"):
        _windowed(use_sliding_window=True, sliding_window=512, layer_types=["chunked_attention"] * 24)
    for bad in ("abc", 0, -1, 4096.5, True):  # one line each, as a models/*.yaml file's
        with pytest.raises(GenconfError, match="sliding_window"):
            _windowed(use_sliding_window=True, sliding_window=bad, max_window_layers=0)
    with pytest.raises(GenconfError, match="sliding_window 1,000,000,000 is out of range"):
        _windowed(use_sliding_window=True, sliding_window=1_000_000_000, max_window_layers=0)


def test_mistral_windows_every_layer_unless_the_config_says_none():
    """MistralConfig's sliding_window is 4,096 when the key is absent; null (v0.2 on) is no window."""
    config = json.loads((HF / "mistral-7b-v0.1" / "config.json").read_text())
    assert hf.model_from_config(config | {"sliding_window": None}, name="m", where="c")[0].sliding_window is None
    config.pop("sliding_window")
    assert hf.model_from_config(config, name="m", where="c")[0].sliding_window == 4096


@pytest.mark.parametrize("name", sorted(PLANNED_COUNTS))
def test_plan_from_a_config_json(name, capsys):
    """`genconf --model path/to/config.json --gpus 64` plans every family (PLAN_GPUS where 64 are too few)."""
    assert main(["--model", str(HF / name / "config.json"), "--gpus", str(PLAN_GPUS.get(name, 64)), "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"]["name"] == name and d["model"]["params"] == PLANNED_COUNTS[name] - UNCOUNTED.get(name, 0)
    assert d["memory"]["total_gib"] <= d["memory"]["usable_gib"]
    assert d["model"]["source"].startswith("Hugging Face config.json")
    # Every approximation the import notes is a warning of the plan, one line each: none is silent. How a field was
    # read (rope scaling's pre-training context) is a note of the import, not a warning.
    imported = load(name)
    assert d["model"]["unmodelled"] == list(imported.spec.unmodelled)
    assert set(imported.spec.unmodelled) <= set(imported.notes)
    assert [w for w in d["warnings"] if w.startswith("model_unmodelled: ")] == [
        f"model_unmodelled: {note}" for note in imported.spec.unmodelled]
    assert not any("rope scaling" in note for note in imported.spec.unmodelled)


def test_plan_from_a_directory_in_text():
    out = subprocess.run(genconf_cmd() + ["--model", str(HF / "qwen3-8b"), "--gpus", "64"], capture_output=True,
                         text=True, cwd=REPO, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "qwen3-8b: 8,190,735,360 parameters" in out.stdout


@pytest.mark.parametrize("name", ["qwen2-7b", "gemma-2-2b", "qwen3-30b-a3b", "gpt2",
                                  "llama-4-maverick-17b-128e-instruct"])
def test_from_hf_writes_a_catalog_yaml(name, tmp_path, capsys):
    out = tmp_path / f"{name}.yaml"
    assert main(["models", "--from-hf", str(HF / name), "-o", str(out)]) == 0
    written = model_from_file(out)
    imported = load(name).spec
    assert written.name == name and exact_param_count(written) == PLANNED_COUNTS[name]
    for field in MODEL_KEYS:
        if field not in ("name", "aliases"):
            assert getattr(written, field) == getattr(imported, field), field
    assert main(["models", "--from-hf", str(HF / name), "-o", str(out)]) == 2  # exists: needs --force
    assert "--force" in capsys.readouterr().err
    assert main(["models", "--from-hf", str(HF / name), "-o", str(out), "--force"]) == 0


# Catalog entries (models/) and the Hugging Face copy of the same checkpoint, or of one with the same tensors.
CATALOG_TWINS = {"llama3-8b": "llama3-8b", "llama3.1-8b": "llama3.1-8b", "llama3.1-70b": "llama3.1-70b",
                 "llama3-70b": "llama3.1-70b", "llama3.2-1b": "llama3.2-1b", "llama3.2-3b": "llama3.2-3b",
                 "qwen2.5-7b": "qwen2-7b", "qwen3-8b": "qwen3-8b", "qwen3-30b-a3b": "qwen3-30b-a3b",
                 "mixtral-8x7b": "mixtral-8x7b-v0.1", "olmo-1b": "olmo-1b-hf", "olmo2-7b": "olmo-2-1124-7b",
                 "mistral-7b-v0.1": "mistral-7b-v0.1", "deepseek-v3": "deepseek-v3", "gpt-oss-120b": "gpt-oss-120b",
                 "gpt-oss-20b": "gpt-oss-20b", "llama4-maverick": "llama-4-maverick-17b-128e-instruct",
                 "llama4-scout": "llama-4-scout-17b-16e-instruct"}


@pytest.mark.parametrize("catalog,copy", sorted(CATALOG_TWINS.items()))
def test_hand_written_catalog_entries_are_the_imported_checkpoints(catalog, copy):
    """A models/*.yaml entry written by hand has the architecture genconf imports from the published config.json
    (every field but the name, the source, the planned sequence length and dropout)."""
    imported = load(copy).spec
    if catalog == "llama3-70b":
        # Llama 3.1 70B is Llama 3 70B's tensors with Llama 3.1's rope scaling (rope_type llama3, factor 8)
        assert imported.rope_scaling_factor == 8.0
        imported = dataclasses.replace(imported, rope_scaling_factor=None)
    if catalog == "llama4-scout":
        # NeMo's Llama4Experts16Config (the catalog's source) sets Llama 3 rope scaling at factor 8, the base release's
        # (low_freq_factor 1, high_freq_factor 4: megatron-core's only shape). The Instruct config.json stored here
        # scales by 16 with high_freq_factor 1, a shape --use-rope-scaling cannot apply: the import notes it and
        # rotates at rope_theta alone. The tensors are the same.
        assert imported.rope_scaling_factor is None and resolve_model(catalog)[0].rope_scaling_factor == 8.0
        assert any("llama3 rope scaling (factor 16) is not written" in n for n in load(copy).notes)
        imported = dataclasses.replace(imported, rope_scaling_factor=8.0)
    assert architecture(resolve_model(catalog)[0]) == architecture(imported)


def test_from_hf_prints_yaml_with_the_notes():
    out = subprocess.run(genconf_cmd() + ["models", "--from-hf", str(HF / "gemma-2-9b" / "config.json")],
                         capture_output=True, text=True, cwd=REPO, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "# 9,241,705,984 parameters" in out.stdout and "sandwich_norm: true" in out.stdout
    assert '  - "the MLP gate is GELU (gelu_pytorch_tanh, GeGLU)' in out.stdout and "kv_channels: 256" in out.stdout
    assert "mamba_num_heads" not in out.stdout  # a derived default is not written out


def test_the_written_yaml_keeps_what_is_not_modelled(tmp_path, capsys):
    """The catalog YAML carries the import notes as data (`unmodelled:`): a plan of the written file warns of them
    as one of the config.json does."""
    imported = load("gemma-2-9b")
    path = tmp_path / "gemma-2-9b.yaml"
    path.write_text(hf.catalog_yaml(imported, exact_param_count(imported.spec)))
    spec = model_from_file(path)
    assert spec.unmodelled == imported.notes and len(spec.unmodelled) == 3 and spec == imported.spec
    assert main(["--model", str(path), "--gpus", "8", "--json"]) == 0
    warned = [w for w in json.loads(capsys.readouterr().out)["warnings"] if w.startswith("model_unmodelled: ")]
    assert len(warned) == 3 and "GeGLU" in warned[0] and "soft-capping" in warned[2]


def test_rope_scaling_is_a_note_of_the_import_not_a_warning(tmp_path):
    """Llama 3.2's rope scaling: planned at the pre-training context, which is a choice, not an approximation; the
    written YAML keeps it as a comment."""
    imported = load("llama3.2-1b")
    assert any("rope scaling" in note for note in imported.notes) and imported.spec.unmodelled == ()
    text = hf.catalog_yaml(imported, exact_param_count(imported.spec))
    assert "# llama3 rope scaling stretches the context to 131,072 tokens" in text and "unmodelled" not in text


@pytest.mark.parametrize("value", ['"one sentence"', "[1, 2]", '[""]', '["  "]', "{a: b}", "[[a, b]]", "42"])
def test_a_malformed_unmodelled_list_is_one_line(tmp_path, value):
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\nnum_layers: 2\nhidden_size: 64\nnum_attention_heads: 4\nffn_hidden_size: 128\n"
                    f"vocab_size: 100\nseq_length: 64\nunmodelled: {value}\n")
    out = subprocess.run(genconf_cmd() + ["--model", str(path), "--gpus", "1"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "unmodelled must be a list of sentences" in out.stderr


def test_a_window_priced_as_full_attention_is_a_plan_warning(tmp_path, capsys):
    """A window pattern no window_attn_skip_freq describes is priced as full causal attention: the plan says so."""
    path = _write(tmp_path, "qwen2-0.5b", use_sliding_window=True, sliding_window=1024,
                  layer_types=["sliding_attention" if i % 3 else "full_attention" for i in range(23)] + ["full_attention"])
    assert main(["--model", str(path), "--gpus", "4", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["model"]["sliding_window"] is None
    assert any(w.startswith("model_unmodelled: ") and "priced as full causal attention" in w for w in d["warnings"])


def _write(tmp_path, name, **changes):
    data = json.loads((HF / name / "config.json").read_text())
    for key, value in changes.items():
        if value is ...:
            data.pop(key)
        else:
            data[key] = value
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir(exist_ok=True)
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize("name,changes,needle", [
    ("llama3-8b", {"architectures": ["FalconForCausalLM"]}, "architecture 'FalconForCausalLM' is not one genconf"),
    ("llama3-8b", {"architectures": ...}, "'architectures' must list one model class"),
    ("llama3-8b", {"num_shared_experts": 2}, "field 'num_shared_experts' is not one genconf knows for LlamaForCausalLM"),
    ("llama3-8b", {"attention_bias": True}, "attention_bias = true is not supported: mlp_bias is false"),
    ("qwen3-30b-a3b", {"mlp_only_layers": [0, 1]}, "mlp_only_layers = [0, 1] is not supported"),
    ("qwen3-30b-a3b", {"decoder_sparse_step": 2}, "decoder_sparse_step = 2 is not supported"),
    ("qwen2-7b", {"hidden_act": "relu"}, "hidden_act = \"relu\" is not supported"),
    ("mixtral-8x7b-v0.1", {"num_local_experts": ...}, "missing field 'num_local_experts'"),
    ("gpt2", {"n_layer": 0}, "field 'n_layer' must be a positive integer, got 0"),
    ("gemma-2b", {"num_key_value_heads": 3}, "must be a multiple of num_query_groups (3)"),
    ("deepseek-v2", {"topk_method": "noaux_tc"}, 'topk_method = "noaux_tc" is not supported: DeepSeek-V2 routes'),
])
def test_what_cannot_be_mapped_is_one_line_and_exit_2(tmp_path, name, changes, needle):
    path = _write(tmp_path, name, **changes)
    out = subprocess.run(genconf_cmd() + ["--model", str(path), "--gpus", "64"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr, out.stderr
    assert str(path) in out.stderr


def test_bad_files_are_one_line(tmp_path, capsys):
    (tmp_path / "empty").mkdir()
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    for ref, needle in ((tmp_path / "empty", "has no config.json"), (bad, "is not valid JSON"),
                        (tmp_path / "missing.json", "does not exist")):
        assert main(["--model", str(ref), "--gpus", "8"]) == 2
        err = capsys.readouterr().err
        assert needle in err and len(err.strip().splitlines()) == 1


def test_hf_module_is_pure():
    code = ("import sys; from genconf.catalog import hf; hf.model_from_hf(sys.argv[1]);"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch','transformers','jinja2','yaml')))")
    out = subprocess.run([sys.executable, "-c", code, str(HF / "gpt2")], capture_output=True, text=True, cwd=REPO)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr


@needs_megatron
def test_megatron_core_builds_the_imported_models_with_the_published_counts():
    """megatron-core's GPTModel, built on the meta device from the imported spec (QKV-only bias, per-head q/k norm,
    head_dim != hidden/heads, 128 experts), has exactly the checkpoint's parameters (no vocabulary padding here)."""
    names = ["qwen2-7b", "qwen3-8b", "gemma-7b", "qwen3-30b-a3b"]
    out = subprocess.run([sys.executable, "-m", "genconf.train.meta_count", *[str(HF / n) for n in names], "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for name in names:
        assert result[name]["built"] == result[name]["planned"] == PUBLIC_COUNTS[name], (name, result[name])


@needs_megatron
def test_megatron_core_builds_gpt_oss_with_its_router_bias():
    """megatron-core's GPTModel of the gpt-oss imports, built on the meta device (local spec, biased linears): its
    TopKRouter takes a bias from add_bias_linear (megatron/core/transformer/moe/router.py, one per expert and layer),
    as genconf counts it; with the attention sinks it lacks (no learnable softmax here) it is the checkpoint."""
    names = ["gpt-oss-20b", "gpt-oss-120b"]
    out = subprocess.run([sys.executable, "-m", "genconf.train.meta_count", *[str(HF / n) for n in names], "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for name in names:
        spec = load(name).spec
        sinks = spec.num_layers * spec.num_attention_heads
        assert sinks == UNCOUNTED[name]
        assert result[name]["built"] == result[name]["planned"] == PUBLIC_COUNTS[name] - sinks, (name, result[name])


@needs_torch
@pytest.mark.parametrize("name", ["qwen2-0.5b", "qwen3-8b", "gemma-2-2b", "olmo-2-1124-7b", "mistral-7b-v0.1",
                                  "gemma-3-1b"])
def test_the_cpu_training_model_builds_the_new_fields_exactly(name):
    """genconf's plain-PyTorch model (DeepSpeed/FSDP launchers) has exactly the planned tensors for QKV-only bias,
    per-head and full-width q/k norms and sandwich norms, and runs forward and backward (a shrunk copy; a window
    shrunk below its sequence)."""
    import dataclasses

    import torch

    from genconf.train.torch_model import GPT

    spec = dataclasses.replace(load(name).spec, num_layers=2, hidden_size=64, num_attention_heads=4,
                               num_query_groups=2, kv_channels=32, ffn_hidden_size=96, vocab_size=128, seq_length=16)
    if spec.sliding_window:
        spec = dataclasses.replace(spec, sliding_window=5)
    model = GPT(spec)
    assert sum(p.numel() for p in model.parameters()) == exact_param_count(spec)
    tokens = torch.randint(0, 128, (2, 16))
    model(tokens, tokens).backward()
    assert all(p.grad is not None for p in model.parameters())


def _config(name: str) -> dict:
    return json.loads((HF / name / "config.json").read_text())


def test_rope_parameters_per_layer_type_take_the_full_layers_base():
    """transformers 5 writes Gemma-3's bases per layer type: the full-attention layers' is the model's rope_theta
    (it was read as Megatron-LM's default 10,000), the windowed layers' own base a note."""
    data = dict(_config("gemma-3-1b"), rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                        "sliding_attention": {"rope_type": "default",
                                                                              "rope_theta": 1e4}})
    for key in ("rope_theta", "rope_scaling", "rope_local_base_freq"):
        data.pop(key, None)
    spec, _, notes = hf.model_from_config(data, name="g", where="config.json")
    assert spec.rope_theta == 1e6
    assert "the windowed layers' rotary base is 10,000: the artifacts rotate every layer at 1,000,000" in notes
    with pytest.raises(GenconfError, match="rotary parameters per layer type are read for sliding_attention, "
                                           "full_attention only"):
        hf.model_from_config(dict(data, rope_parameters={"chunked_attention": {"rope_theta": 1e6}}), name="g",
                             where="config.json")


@pytest.mark.parametrize("scaling,why", [
    ({"type": "linear", "factor": "x"}, "its factor must be a positive number"),
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": "4096"},
     "its original_max_position_embeddings must be a positive integer"),
    ("linear", "an object of rotary parameters"),
    # A layer type's parameters given as a number were read as a flat dict's key and the config accepted.
    ({"full_attention": 1}, "the rotary parameters of full_attention must be an object"),
])
def test_a_malformed_rope_scaling_is_one_line(scaling, why):
    with pytest.raises(GenconfError, match=why):
        hf.model_from_config(dict(_config("llama3-8b"), rope_scaling=scaling), name="l", where="config.json")


def test_keys_at_their_harmless_defaults_are_read_past_and_other_values_refused():
    """Gemma-3, SmolLM2 and Qwen2.5 configs on the Hub write these out; a real value of them changes the model."""
    base = _config("llama3-8b")
    spec, _, _ = hf.model_from_config(dict(base, use_bidirectional_attention=False, rope_interleaved=False,
                                           is_llama_config=True, **{"transformers.js_config": {"dtype": "q4"}}),
                                      name="l", where="config.json")
    assert spec.num_layers == 32
    with pytest.raises(GenconfError, match="use_bidirectional_attention = true is not supported: genconf imports "
                                           "models with use_bidirectional_attention false"):
        hf.model_from_config(dict(base, use_bidirectional_attention=True), name="l", where="config.json")
    # Qwen2.5's config.json writes use_mrope false (tests/data/hf/qwen2.5-0.5b); true is Qwen2-VL's multimodal rotary
    qwen = _config("qwen2.5-0.5b")
    assert qwen["use_mrope"] is False
    assert hf.model_from_config(qwen, name="q", where="config.json")[0].num_layers == 24
    with pytest.raises(GenconfError, match="use_mrope = true is not supported"):
        hf.model_from_config(dict(qwen, use_mrope=True), name="q", where="config.json")


def test_a_tokenizer_config_is_named_as_one():
    with pytest.raises(GenconfError, match="looks like a tokenizer's config .* give the model's config.json"):
        hf.model_from_config({"tokenizer_class": "LlamaTokenizer", "model_max_length": 4096}, name="t",
                             where="tokenizer_config.json")


def test_what_the_artifacts_build_otherwise_is_said():
    """GPT-2's tanh GELU and Gemma-2 27B's attention scale 1/sqrt(144) (head dim 128) are built otherwise: notes,
    which every plan of the model prints as warnings."""
    assert any("gelu_new (an approximation of GELU) is built as exact GELU" in n for n in load("gpt2").spec.unmodelled)
    assert not any("GELU" in n for n in load("pythia-160m").spec.unmodelled)  # exact GELU: nothing to say
    notes = load("gemma-2-27b").spec.unmodelled
    assert any("scaled by 1/sqrt(144) (query_pre_attn_scalar)" in n and "head_dim 128" in n for n in notes)
    assert not any("query_pre_attn_scalar" in n for n in load("gemma-2-9b").spec.unmodelled)  # 256 = head_dim


def test_an_import_plans_a_pre_training_length_not_the_served_context():
    """Mistral-Nemo serves 1,024,000 tokens and Qwen3 40,960: planned by default at those, an import was a
    long-context run (cp 16, minutes per step); it plans at hf.DEFAULT_SEQ_LENGTH and says so."""
    qwen = load("qwen3-8b")
    assert qwen.spec.seq_length == hf.DEFAULT_SEQ_LENGTH == 8192
    assert any("max_position_embeddings is 40,960" in n and "--seq-len" in n for n in qwen.notes)
    assert load("llama3.2-1b").spec.seq_length == 8192  # rope scaling's pre-training context, as before
    assert load("gpt2").spec.seq_length == 1024  # shorter than the default: its own


def test_transformers_5_partial_rotary_factor_in_rope_parameters():
    """transformers 5 keeps GPT-NeoX's share in rope_parameters: read there too; a family genconf imports without
    partial rotary refuses it rather than rotating every dimension."""
    data = _config("pythia-160m")
    data.pop("rotary_pct", None)
    data["rope_parameters"] = {"rope_type": "default", "rope_theta": 10000, "partial_rotary_factor": 0.25}
    assert hf.model_from_config(data, name="p", where="c")[0].rotary_percent == 0.25
    llama = dict(_config("llama3-8b"), rope_parameters={"rope_type": "default", "rope_theta": 5e5,
                                                        "partial_rotary_factor": 0.5})
    with pytest.raises(GenconfError, match="partial rotary embeddings for GPT-NeoX only, not LlamaForCausalLM"):
        hf.model_from_config(llama, name="l", where="c")


def test_a_rope_scaled_pre_training_context_is_capped_too():
    yarn = dict(_config("qwen2-7b"), max_position_embeddings=131072,
                rope_scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})
    spec, _, notes = hf.model_from_config(yarn, name="q", where="c")
    assert spec.seq_length == 8192 and any("from 32,768" in n for n in notes)


def test_router_aux_loss_coef_is_passed_1_to_1_with_its_scale_noted():
    # Megatron-Bridge's bridges map router_aux_loss_coef to moe_aux_loss_coeff unchanged. transformers pools all
    # layers' tokens into one loss counting each of a token's k choices (Mixtral's 32 layers, top 2), megatron-core
    # adds one loss per layer over fractions of T x k choices: 0.02 x 2 / 32 = 0.00125 matches transformers' strength.
    mixtral = load("mixtral-8x7b-v0.1")
    assert mixtral.spec.moe_aux_loss_coeff == 0.02
    assert [n for n in mixtral.notes if "router_aux_loss_coef" in n] == [
        "router_aux_loss_coef 0.02 is written as --moe-aux-loss-coeff 0.02, as Megatron-Bridge maps it; megatron-core "
        "adds that loss per layer over top-2 fractions, so 0.00125 (x 2 / 32 layers) would balance as transformers' "
        "pooled loss does"]
    assert not any("router_aux_loss_coef" in n for n in mixtral.spec.unmodelled)  # a note of the import, no warning
    silent = hf.model_from_config(dict(_config("mixtral-8x7b-v0.1"), router_aux_loss_coef=0.0), name="m", where="t")
    assert silent[0].moe_aux_loss_coeff == 0.0 and not any("router_aux_loss_coef" in n for n in silent[2])


def test_a_name_that_is_not_a_model_name_is_the_flags_fault(capsys):
    # It read 'HF/llama3.2-1b/config.json: ModelSpec.name must be lowercase without spaces, got 'My Model'': the
    # config.json was blamed for --name.
    assert main(["models", "--from-hf", str(HF / "llama3.2-1b"), "--name", "My Model"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("genconf: error: --name 'My Model': a model's name is lowercase without spaces, such "
                                 "as 'my-model'\n")


def test_deepseek_v3_reads_its_router_and_refuses_other_routing():
    """DeepSeek-V3's config.json (tests/data/hf/deepseek-v3) as models/deepseek-v3.yaml has it; Kimi K2 (the same
    DeepseekV3ForCausalLM class) with its published shape is models/kimi-k2.yaml."""
    spec = load("deepseek-v3").spec
    assert (spec.kv_lora_rank, spec.q_lora_rank, spec.first_k_dense_replace, spec.mtp_num_layers) == (512, 1536, 3, 1)
    assert spec.moe_shared_expert_intermediate_size == 2048 and spec.moe_router_num_groups == 8
    # "37B activated for each token" (DeepSeek-V3 technical report, abstract)
    assert 37e9 < active_param_count(dataclasses.replace(spec, mtp_num_layers=0)) < 38e9
    base = _config("deepseek-v3")
    # Kimi-K2-Instruct's shape (models/kimi-k2.yaml's source lists its config.json values; aux_loss_alpha as
    # Megatron-Bridge's Kimi bridge sets it).
    kimi = dict(base, num_attention_heads=64, num_key_value_heads=64, n_routed_experts=384, first_k_dense_replace=1,
                num_nextn_predict_layers=0, vocab_size=163840, n_group=1, topk_group=1, routed_scaling_factor=2.827,
                rope_theta=50000.0, aux_loss_alpha=0.001,
                rope_scaling=dict(base["rope_scaling"], factor=32, original_max_position_embeddings=4096))
    imported = hf.model_from_config(kimi, name="kimi-k2", where="config.json")[0]
    assert architecture(imported) == architecture(resolve_model("kimi-k2")[0])
    for key, value, why in [("topk_method", "greedy", "noaux_tc routing"), ("scoring_func", "softmax", "sigmoid"),
                            ("norm_topk_prob", False, "renormalises"), ("moe_layer_freq", 2, "moe_layer_freq 1"),
                            ("attention_bias", True, "no biases"), ("num_key_value_heads", 8, "one key and value")]:
        with pytest.raises(GenconfError, match=f"{key} = .* is not supported: .*{why}"):
            hf.model_from_config(dict(base, **{key: value}), name="d", where="config.json")


def test_gpt_oss_reads_its_window_pattern_clamp_and_biases():
    spec = load("gpt-oss-120b").spec
    assert (spec.sliding_window, spec.window_attn_skip_freq, spec.activation_clamp) == (128, 2, 7.0)
    assert spec.add_bias_linear and spec.moe_router_load_balancing == "none"
    assert any("attention sinks" in n for n in spec.unmodelled)
    base = _config("gpt-oss-120b")
    with pytest.raises(GenconfError, match="attention_bias = false is not supported: gpt-oss's experts keep"):
        hf.model_from_config(dict(base, attention_bias=False), name="g", where="config.json")
    with pytest.raises(GenconfError, match="experts_per_token = 2 is not supported"):
        hf.model_from_config(dict(base, experts_per_token=2), name="g", where="config.json")
    # gpt-oss-20b's config.json is the 120b's with 24 layers and 32 experts (its model card, Table 1: 20.91B parameters)
    small = _config("gpt-oss-20b")
    assert small == dict(base, num_hidden_layers=24, num_local_experts=32, layer_types=base["layer_types"][:24])
    spec = load("gpt-oss-20b").spec
    assert (spec.windowed_layers, spec.num_experts, spec.moe_top_k) == (12, 32, 4)
    # "3.6B active" (the model card): 4 of 32 experts and the sinks, less the input embedding
    active = active_param_count(spec) + UNCOUNTED["gpt-oss-20b"] - spec.vocab_size * spec.hidden_size
    assert round(active / 1e9, 1) == 3.6


def test_qwen2_moe_imports_its_gated_shared_expert():
    """Qwen1.5-MoE-A2.7B: 60 experts of 1,408, top 4, a shared expert of 5,632 behind a sigmoid gate (hidden_size
    parameters a layer: megatron-core's moe_shared_expert_gate, rendered as --moe-shared-expert-gate)."""
    spec = load("qwen1.5-moe-a2.7b").spec
    assert (spec.num_experts, spec.moe_top_k, spec.moe_ffn_hidden_size) == (60, 4, 1408)
    assert spec.moe_shared_expert_intermediate_size == 5632 and spec.moe_shared_expert_gate and spec.add_qkv_bias
    assert spec.moe_router_pre_softmax  # norm_topk_prob false
    gates = [t for t in layer_tensors(spec) if t.name == "mlp.shared_experts.gate_weight"]
    assert [t.numel for t in gates] == [2048]
    ungated = dataclasses.replace(spec, moe_shared_expert_gate=False)
    assert exact_param_count(spec) - exact_param_count(ungated) == 24 * 2048
    # "2.7B activated" (the model's name and card): the top 4 of 60 experts, the shared expert and its gate.
    assert round(active_param_count(spec) / 1e9, 1) == 2.7
    base = _config("qwen1.5-moe-a2.7b")
    with pytest.raises(GenconfError, match="decoder_sparse_step = 2 is not supported"):
        hf.model_from_config(dict(base, decoder_sparse_step=2), name="q", where="config.json")
    with pytest.raises(GenconfError, match=r"mlp_only_layers = \[0\] is not supported"):
        hf.model_from_config(dict(base, mlp_only_layers=[0]), name="q", where="config.json")
    with pytest.raises(ValueError, match="moe_shared_expert_gate gates the shared experts"):
        dataclasses.replace(spec, moe_shared_expert_intermediate_size=None)


def test_the_shared_expert_gate_is_a_megatron_flag():
    """--moe-shared-expert-gate (Megatron-LM core_v0.16.1 arguments.py, made by ArgumentGroupFactory from
    TransformerConfig.moe_shared_expert_gate) is rendered, parsed, given to TransformerConfig and read back."""
    from genconf.check.megatron import parse_megatron_args
    from genconf.plan.specs import ParallelPlan, TrainSpec
    from genconf.render.megatron import megatron_args, megatron_args_text, megatron_config_kwargs, megatron_plan

    spec = load("qwen1.5-moe-a2.7b").spec
    plan = ParallelPlan(framework="megatron", tp=1, ep=8, dp=8, mbs=1, gbs=64, seq_length=4096, zero_stage=1,
                        precision="bf16", grad_dtype="bf16")
    text = megatron_args_text(megatron_args(spec, plan, TrainSpec(train_steps=10)))
    args, problems = parse_megatron_args(text)
    assert problems == [] and "--moe-shared-expert-gate" in args
    values = {flag: a.value for flag, a in args.items()}
    assert megatron_config_kwargs(values)["moe_shared_expert_gate"] is True
    back, _ = megatron_plan(values, spec, 8)
    assert back.moe_shared_expert_gate and exact_param_count(back) == 14_315_784_192
    ungated = dataclasses.replace(spec, moe_shared_expert_gate=False)
    assert "--moe-shared-expert-gate" not in megatron_args_text(megatron_args(ungated, plan, TrainSpec(train_steps=10)))


def test_phi3_fused_projections_window_and_rotary_share():
    """Phi-3-mini-4k: sliding_window 2047 on every layer (modeling_phi3 passes config.sliding_window to each layer's
    attention, as Mistral's); Phi-3.5-mini and Phi-4-mini (mlc-ai/mlc-llm model_preset.py `phi-3_5`, `phi-4`): longrope
    from 4,096 tokens, a 262,144-token window that masks nothing, and Phi-4-mini's partial_rotary_factor 0.75."""
    spec = load("phi-3-mini-4k-instruct").spec
    assert (spec.sliding_window, spec.window_attn_skip_freq, spec.seq_length) == (2047, 0, 4096)
    base = _config("phi-3-mini-4k-instruct")
    longrope = {"type": "longrope", "long_factor": [1.0] * 48, "short_factor": [1.0] * 48}
    phi35 = dict(base, max_position_embeddings=131072, sliding_window=262144, rope_scaling=longrope)
    spec35, _, notes = hf.model_from_config(phi35, name="p", where="config.json")
    assert spec35.sliding_window is None and spec35.seq_length == 4096 and exact_param_count(spec35) == 3_821_079_552
    assert any("longrope" in n for n in notes) and any("262,144" in n for n in notes)
    # microsoft/Phi-4-mini-instruct: 24 heads, 8 KV heads, vocab 200,064 tied; the model card's 3.8B (3,836,021,760).
    phi4 = dict(phi35, num_attention_heads=24, num_key_value_heads=8, vocab_size=200064, tie_word_embeddings=True,
                partial_rotary_factor=0.75, full_attn_mod=1, interpolate_factor=1, lm_head_bias=False, mlp_bias=False,
                rope_scaling=dict(longrope, long_factor=[1.0] * 48, short_factor=[1.0] * 48))
    spec4 = hf.model_from_config(phi4, name="p", where="config.json")[0]
    assert spec4.rotary_percent == 0.75 and exact_param_count(spec4) == 3_836_021_760
    for key, value in [("attention_bias", True), ("mlp_bias", True), ("lm_head_bias", True), ("full_attn_mod", 2),
                       ("interpolate_factor", 2), ("partial_rotary_factor", 1.5)]:
        with pytest.raises(GenconfError, match=f"{key} = .* is not supported"):
            hf.model_from_config(dict(phi4, **{key: value}), name="p", where="config.json")
    # The old code did not know the family.
    assert hf.FAMILIES["Phi3ForCausalLM"][0] == "phi3"


GRANITE_2B = {  # ibm-granite/granite-3.1-2b-instruct's shape (vocab 49,155), the Granite 3.x multipliers
    "architectures": ["GraniteForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "attention_multiplier": 0.015625, "embedding_multiplier": 12.0, "hidden_act": "silu", "hidden_size": 2048,
    "intermediate_size": 8192, "logits_scaling": 8.0, "max_position_embeddings": 131072, "mlp_bias": False,
    "model_type": "granite", "num_attention_heads": 32, "num_hidden_layers": 40, "num_key_value_heads": 8,
    "residual_multiplier": 0.22, "rms_norm_eps": 1e-05, "rope_scaling": None, "rope_theta": 5000000.0,
    "tie_word_embeddings": True, "vocab_size": 49155}


def test_granite_reads_past_its_multipliers():
    """Granite 3.x: Llama's tensors; its four scalar multipliers change no count and are noted. The Hub's parameter
    counts: granite-3.1-2b-instruct (and granite-guardian-3.1-2b) 2,533,531,648; granite-3.1-2b-base, vocab 49,152,
    2,533,525,504; granite-3.3-8b-instruct (4096 wide, 12,800 MLP, vocab 49,159) 8,170,864,640 ("8.17B")."""
    spec, _, notes = hf.model_from_config(GRANITE_2B, name="g", where="config.json")
    assert exact_param_count(spec) == 2_533_531_648 and spec.tie_embeddings and spec.num_query_groups == 8
    assert any("residual_multiplier 0.22" in n for n in spec.unmodelled)
    base = hf.model_from_config(dict(GRANITE_2B, vocab_size=49152), name="g", where="config.json")[0]
    assert exact_param_count(base) == 2_533_525_504
    big = dict(GRANITE_2B, hidden_size=4096, intermediate_size=12800, vocab_size=49159, logits_scaling=16.0,
               attention_multiplier=0.0078125, rope_theta=10000000.0)
    assert exact_param_count(hf.model_from_config(big, name="g", where="config.json")[0]) == 8_170_864_640
    with pytest.raises(GenconfError, match="residual_multiplier = 0 is not supported"):
        hf.model_from_config(dict(GRANITE_2B, residual_multiplier=0), name="g", where="config.json")
    with pytest.raises(GenconfError, match="attention_bias = true is not supported"):
        hf.model_from_config(dict(GRANITE_2B, attention_bias=True), name="g", where="config.json")


OLMOE_1B_7B = {  # allenai/OLMoE-1B-7B-0924's shape (Megatron-Bridge tests/unit_tests/models/olmoe, OLMoE paper Table 1)
    "architectures": ["OlmoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "clip_qkv": None,
    "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 1024, "max_position_embeddings": 4096,
    "model_type": "olmoe", "norm_topk_prob": False, "num_attention_heads": 16, "num_experts": 64,
    "num_experts_per_tok": 8, "num_hidden_layers": 16, "num_key_value_heads": 16, "rms_norm_eps": 1e-05,
    "rope_scaling": None, "rope_theta": 10000.0, "router_aux_loss_coef": 0.01, "tie_word_embeddings": False,
    "vocab_size": 50304}


def test_olmoe_experts_and_full_width_qk_norm():
    """OLMoE-1B-7B: 6,919,161,856 parameters (the Hub's F32 count of allenai/OLMoE-1B-7B-0924, and the BF16 count of
    its -Instruct safetensors headers), 1.3B active (OLMoE paper); q/k norms over the full width (modeling_olmoe:
    q_norm RMSNorm(hidden_size), as OLMo-2's), 64 experts top 8, no shared expert."""
    spec = hf.model_from_config(OLMOE_1B_7B, name="o", where="config.json")[0]
    assert exact_param_count(spec) == 6_919_161_856
    assert round(active_param_count(spec) / 1e9, 1) == 1.3
    assert spec.qk_layernorm and not spec.qk_layernorm_per_head and spec.moe_router_pre_softmax
    assert (spec.num_experts, spec.moe_top_k, spec.moe_ffn_hidden_size) == (64, 8, 1024)
    assert spec.moe_shared_expert_intermediate_size is None
    clipped = hf.model_from_config(dict(OLMOE_1B_7B, clip_qkv=8.0), name="o", where="config.json")[0]
    assert any("clipped" in n for n in clipped.unmodelled)
    with pytest.raises(GenconfError, match="attention_bias = true is not supported"):
        hf.model_from_config(dict(OLMOE_1B_7B, attention_bias=True), name="o", where="config.json")


def test_an_absent_q_lora_rank_is_the_config_class_default_and_null_is_none():
    """DeepseekV2Config and DeepseekV3Config default q_lora_rank to 1536; a config.json's null (DeepSeek-V2-Lite) means
    no query latent. An absent key was read as null, a model without the query latent."""
    base = _config("deepseek-v3")
    absent = {k: v for k, v in base.items() if k != "q_lora_rank"}
    assert hf.model_from_config(absent, name="d", where="c")[0].q_lora_rank == 1536
    assert hf.model_from_config(dict(base, q_lora_rank=None), name="d", where="c")[0].q_lora_rank is None


def test_deepseek_v2_reads_its_router_as_megatron_core_routes_it():
    """DeepSeek-V2 (tests/data/hf/deepseek-v2) and V2-Lite: modeling_deepseek's MoEGate keeps the top k's weights from
    the softmax over every expert (norm_topk_prob false) times routed_scaling_factor: megatron-core's pre-softmax router
    with --moe-router-topk-scaling-factor (Megatron-Bridge's DeepSeek-V2 bridge: moe_router_pre_softmax,
    seq_aux_loss at aux_loss_alpha); group_limited_greedy keeps topk_group of n_group groups, greedy every expert."""
    v2 = load("deepseek-v2").spec
    assert (v2.kv_lora_rank, v2.q_lora_rank, v2.first_k_dense_replace, v2.moe_shared_expert_intermediate_size) == \
        (512, 1536, 1, 2 * 1536)
    assert (v2.moe_router_score_function, v2.moe_router_pre_softmax, v2.moe_router_expert_bias) == \
        ("softmax", True, False)
    assert (v2.moe_router_topk_scaling_factor, v2.moe_router_num_groups, v2.moe_router_group_topk) == (16.0, 8, 3)
    assert (v2.moe_router_load_balancing, v2.moe_aux_loss_coeff, v2.mtp_num_layers) == ("seq_aux_loss", 0.001, 0)
    # megatron-core ranks a group by the sum of its top 6 // 3 = 2 scores, MoEGate by its best one: a plan warning.
    assert [n for n in v2.unmodelled if "expert groups" in n] == [
        "DeepSeek-V2 ranks its 8 expert groups by each group's best expert score; megatron-core's group-limited "
        "routing ranks them by the sum of their top 2 (top-6 over 3 groups): the same tensors and FLOPs, tokens may "
        "reach other groups"]
    # "21B activated for each token" (DeepSeek-V2 paper, abstract): 21.38B with the embedding and output layer.
    assert 21e9 < active_param_count(v2) < 22e9
    lite = load("deepseek-v2-lite").spec
    assert (lite.q_lora_rank, lite.num_experts, lite.moe_top_k, lite.moe_shared_expert_intermediate_size) == \
        (None, 64, 6, 2 * 1408)
    assert (lite.moe_router_pre_softmax, lite.moe_router_topk_scaling_factor, lite.moe_router_num_groups) == \
        (True, None, None)
    assert lite.unmodelled == ()  # greedy routing: nothing megatron-core routes otherwise
    # "2.4B activated" (the model card): 2.45B without the input embedding, which no token multiplies.
    assert 2.4e9 < active_param_count(lite) - 102400 * 2048 < 2.5e9

    base = _config("deepseek-v2")

    def imported(**changes):
        return hf.model_from_config(dict(base, **changes), name="d", where="config.json")[0]

    # greedy (or one group) chooses among every expert: no groups rendered; a group of the top k / topk_group = 1
    # best experts is MoEGate's rule exactly.
    assert imported(topk_method="greedy").moe_router_num_groups is None
    assert imported(n_group=1, topk_group=1).moe_router_group_topk is None
    assert not any("expert groups" in n for n in imported(topk_group=6).unmodelled)
    # norm_topk_prob: the top k renormalised, unscaled (MoEGate), which megatron-core's softmax over the k chosen is.
    renormalised = imported(norm_topk_prob=True, routed_scaling_factor=1.0)
    assert not renormalised.moe_router_pre_softmax and renormalised.moe_router_topk_scaling_factor is None
    assert imported(seq_aux=False).moe_router_load_balancing == "aux_loss"
    assert imported(aux_loss_alpha=0.0).moe_router_load_balancing == "none"
    # transformers 5's DeepseekV2Config writes head_dim (= qk_rope_head_dim) and mlp_bias false out.
    assert imported(head_dim=64, mlp_bias=False).qk_pos_emb_head_dim == 64
    for key, value, why in [
            ("topk_method", "noaux_tc", "DeepSeek-V2 routes greedy or group_limited_greedy"),
            ("scoring_func", "sigmoid", "scores experts with a softmax"),
            ("norm_topk_prob", True, "leaves the renormalised weights unscaled"),
            ("n_group", 7, "n_group must divide the experts"), ("topk_group", 9, "at most n_group"),
            ("aux_loss_alpha", -1, "a number >= 0"), ("moe_layer_freq", 2, "moe_layer_freq 1"),
            ("head_dim", 128, "sets it to qk_rope_head_dim"), ("mlp_bias", True, "no biases"),
            ("num_nextn_predict_layers", 1, "not one genconf knows for DeepseekV2ForCausalLM")]:
        with pytest.raises(GenconfError, match=why):
            imported(**{key: value})
    with pytest.raises(GenconfError, match="topk_group = 3 is not supported: .* num_experts_per_tok 2"):
        imported(num_experts_per_tok=2)


@needs_megatron
@pytest.mark.parametrize("name", ["deepseek-v2", "deepseek-v2-lite"])
def test_deepseek_v2_s_megatron_arguments_pass_megatron_core_s_config(name):
    """The rendered arguments parse as Megatron-LM's (genconf check), build megatron-core's MLATransformerConfig (its
    __post_init__ holds the router asserts), and read back as the imported router; V2-Lite writes no --q-lora-rank,
    which megatron-core reads as None (queries projected straight from the hidden state)."""
    import torch
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    from genconf.check.megatron import parse_megatron_args
    from genconf.plan.specs import ParallelPlan, TrainSpec
    from genconf.render.megatron import megatron_args, megatron_args_text, megatron_config_kwargs, megatron_plan

    spec = load(name).spec
    plan = ParallelPlan(framework="megatron", tp=1, ep=8, etp=1, dp=8, mbs=1, gbs=64, seq_length=4096, zero_stage=1,
                        precision="bf16", grad_dtype="bf16")
    args, problems = parse_megatron_args(megatron_args_text(megatron_args(spec, plan, TrainSpec(train_steps=10))))
    assert problems == []
    values = {flag: a.value for flag, a in args.items()}
    assert ("--q-lora-rank" in values) == (spec.q_lora_rank is not None)
    kw = megatron_config_kwargs(values)
    kw.update(params_dtype=getattr(torch, kw["params_dtype"]), pipeline_dtype=getattr(torch, kw["pipeline_dtype"]),
              activation_func=torch.nn.functional.silu)
    config = MLATransformerConfig(**kw)
    assert config.q_lora_rank == spec.q_lora_rank and config.moe_layer_freq == [0] + [1] * (spec.num_layers - 1)
    assert (config.moe_router_score_function, config.moe_router_pre_softmax, config.moe_router_enable_expert_bias,
            config.moe_router_topk_scaling_factor, config.moe_router_num_groups, config.moe_router_group_topk,
            config.moe_router_load_balancing_type, config.moe_aux_loss_coeff) == (
        "softmax", True, False, spec.moe_router_topk_scaling_factor, spec.moe_router_num_groups,
        spec.moe_router_group_topk, "seq_aux_loss", 0.001)
    back, _ = megatron_plan(values, spec, 64)
    router = [f for f in dataclasses.asdict(spec) if f.startswith("moe_")] + ["q_lora_rank", "first_k_dense_replace"]
    assert {f: getattr(back, f) for f in router} == {f: getattr(spec, f) for f in router}
    assert exact_param_count(back) == PUBLIC_COUNTS[name]


MLA_META_COUNT = mcore_cpu_script("29850 + os.getpid() % 100", """
from genconf.plan.counting import exact_param_count
from genconf.train.runners import megatron as runner
import megatron.core.transformer.multi_latent_attention as mla_module

# As tests/train/test_train.py counts MLA: megatron-core 0.16.1's local DotProductAttention refuses MLA's k_channels,
# so every layer's parameter-free core attention is megatron-core's IdentityOp, and HAVE_TE the host's truth.
mla_module.HAVE_TE = False
local_specs = runner.model_specs


def identity_core_attention(cfg, config, use_te, vp_stage=None):
    decoder, mtp, name = local_specs(cfg, config, use_te, vp_stage)
    for layer in decoder.layer_specs:
        attention = layer.submodules.self_attention
        attention.submodules = dataclasses.replace(attention.submodules, core_attention=IdentityOp)
    return decoder, mtp, name


runner.model_specs = identity_core_attention
out = {}
for path in sys.argv[1:]:
    model, _ = resolve_model(path)
    plan = ParallelPlan(framework="megatron", dp=1, mbs=1, gbs=1, seq_length=model.seq_length, layer_spec="local")
    cfg = RunConfig(model=model, plan=plan, train=TrainSpec(train_steps=1), num_gpus=1, data={},
                    precision_recipe="bf16", prediction={}, shrink={}, artifacts="")
    config = runner.transformer_config(dict(runner.transformer_config_kwargs(cfg, cpu=True),
                                            perform_initialization=False))
    with torch.device("meta"):
        gpt = runner.gpt_model(cfg, config, use_te=False)
    out[model.name] = {"built": sum(p.numel() for p in gpt.parameters()), "planned": exact_param_count(model),
                       "q_lora_rank": config.q_lora_rank}
    del gpt
print(json.dumps(out))
ps.destroy_model_parallel()
torch.distributed.destroy_process_group()
compat.uninstall()
""")


@needs_megatron
def test_megatron_core_builds_deepseek_v2_with_the_published_counts():
    """megatron-core's GPTModel from the imported specs' rendered arguments, built on the meta device (local spec, MLA
    with and without the query latent, 160 and 64 experts, group-limited routing), has exactly the checkpoints'
    parameters (no vocabulary padding: 102,400 is a multiple of 128)."""
    names = ["deepseek-v2-lite", "deepseek-v2"]
    out = subprocess.run([sys.executable, "-c", MLA_META_COUNT, *[str(HF / n) for n in names]], capture_output=True,
                         text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for name in names:
        assert result[name]["built"] == result[name]["planned"] == PUBLIC_COUNTS[name], (name, result[name])
    assert (result["deepseek-v2-lite"]["q_lora_rank"], result["deepseek-v2"]["q_lora_rank"]) == (None, 1536)


MAVERICK, SCOUT = "llama-4-maverick-17b-128e-instruct", "llama-4-scout-17b-16e-instruct"

# modeling_llama4's vision tower at the released vision_config (NeMo's Llama4VisionConfig: 34 layers of width 1408 with
# biases, MLP 5632, 336-pixel images in 14-pixel patches): class and 577 position embeddings, the patch projection, two
# LayerNorms, the layers (q, k, v, o and fc1, fc2 with biases, two LayerNorms), the pixel-shuffle MLP (5632 -> 4096 ->
# 4096) and the projector (4096 -> 5120, no bias).
LLAMA4_VISION = (1408 + 577 * 1408 + 3 * 14 * 14 * 1408 + 4 * 1408
                 + 34 * (4 * (1408 * 1408 + 1408) + 2 * 1408 * 5632 + 5632 + 1408 + 4 * 1408)
                 + 5632 * 4096 + 4096 * 4096 + 4096 * 5120)


def test_llama4_text_decoders_are_the_cards_totals_less_the_vision_tower():
    """Meta's model cards: Maverick 400B total, Scout 109B, both 17B active; the import plus the vision tower it leaves
    out (871,932,416) is within half a percent of the rounded totals (401.58B, 108.64B)."""
    assert LLAMA4_VISION == 871_932_416
    for name, card in ((MAVERICK, 400e9), (SCOUT, 109e9)):
        spec = load(name).spec
        assert exact_param_count(spec) == TEXT_DECODER_COUNTS[name]
        assert abs(exact_param_count(spec) + LLAMA4_VISION - card) < 0.005 * card, name
        assert 17.0e9 <= active_param_count(spec) < 17.5e9, name  # one routed expert, the shared one, all of attention


def test_llama4_reads_its_interleaved_moe_layers_router_and_shared_expert():
    """text_config's fields as ModelSpec's: the dense layers' MLP from intermediate_size_mlp, the experts' and the
    shared expert's from intermediate_size, interleave_moe_layer_step as moe_layer_interval (Maverick 2: layers 1, 3,
    ..., 47 MoE; Scout 1), Llama4Router's top-1 sigmoid; what the artifacts do not build is a plan warning each."""
    maverick, scout = load(MAVERICK), load(SCOUT)
    for model, experts, interval in ((maverick, 128, 2), (scout, 16, 1)):
        spec = model.spec
        assert (spec.num_layers, spec.hidden_size, spec.num_attention_heads, spec.num_query_groups,
                spec.kv_channels) == (48, 5120, 40, 8, 128)
        assert (spec.ffn_hidden_size, spec.moe_ffn_hidden_size, spec.moe_shared_expert_intermediate_size) == (
            16384, 8192, 8192)
        assert (spec.num_experts, spec.moe_top_k, spec.moe_layer_interval) == (experts, 1, interval)
        assert (spec.moe_router_score_function, spec.moe_router_pre_softmax, spec.moe_aux_loss_coeff) == (
            "sigmoid", False, 0.0)
        assert (spec.vocab_size, spec.rope_theta, spec.tie_embeddings, spec.seq_length) == (202048, 5e5, False, 8192)
        assert not spec.add_bias_linear and not spec.qk_layernorm and spec.activation == "swiglu"
        assert model.architecture == "Llama4ForConditionalGeneration"
        assert spec.unmodelled[0].startswith("the import plans the text decoder only")
        assert any(n.startswith("its 12 NoPE layers (3, 7, ..., 47) skip RoPE") for n in spec.unmodelled)
        assert any(n.startswith("its chunked attention (8,192-token chunks on 36 of 48 layers) is priced as full")
                   for n in spec.unmodelled)
    assert maverick.spec.dense_layers == 24 and scout.spec.dense_layers == 0
    # Scout normalises queries and keys (use_qk_norm true, weightless L2), Maverick does not.
    assert [any("use_qk_norm" in n for n in m.spec.unmodelled) for m in (maverick, scout)] == [False, True]
    # How fields were read is a note of the import, not a plan warning.
    said = [n for n in scout.notes if n not in scout.spec.unmodelled]
    assert any(n.startswith("router_aux_loss_coef 0.001 is not written") for n in said)


def _llama4(name: str, **text_changes) -> dict:
    data = json.loads((HF / name / "config.json").read_text())
    for key, value in text_changes.items():
        if value is ...:
            data["text_config"].pop(key)
        else:
            data["text_config"][key] = value
    return data


def test_llama4_text_only_config_is_the_same_decoder():
    """Llama4ForCausalLM's config.json (Llama4TextConfig at the top level) imports as the text_config it is, without
    the vision tower's note."""
    nested = load(MAVERICK)
    text = dict(json.loads((HF / MAVERICK / "config.json").read_text())["text_config"],
                architectures=["Llama4ForCausalLM"])
    spec, arch, notes = hf.model_from_config(text, name=nested.spec.name, where="c")
    assert arch == "Llama4ForCausalLM"
    assert spec == dataclasses.replace(nested.spec, source=spec.source, unmodelled=nested.spec.unmodelled[1:])
    assert not any("vision" in n for n in notes)


def test_llama4_reads_the_hub_file_s_other_keys():
    """The stored copies keep the text_config fields their source reads; the Hub's files also carry the image
    tokens, the vision_config, and text_config's token ids, temperature tuning, quantizer flag and (as transformers
    writes them back) moe_layers, no_rope_layers and layer_types: read past or checked, the same model."""
    data = _llama4(SCOUT, bos_token_id=200000, eos_token_id=[200001, 200007, 200008], pad_token_id=200018,
                   attn_scale=0.1, attn_temperature_tuning=4, floor_scale=8192, for_llm_compressor=False,
                   router_jitter_noise=0.0, initializer_range=0.02, moe_layers=list(range(48)),
                   no_rope_layers=[int((i + 1) % 4 != 0) for i in range(48)],
                   layer_types=["chunked_attention" if (i + 1) % 4 else "full_attention" for i in range(48)])
    data.update(boi_token_index=200080, eoi_token_index=200081, image_token_index=200092, tie_word_embeddings=False,
                vision_config={"hidden_size": 1408, "num_hidden_layers": 34, "intermediate_size": 5632})
    assert hf.model_from_config(data, name=SCOUT, where="c")[0] == load(SCOUT).spec


@pytest.mark.parametrize("name,changes,needle", [
    (MAVERICK, {"num_hidden_layers": 47}, "interleave_moe_layer_step = 2 is not supported: num_hidden_layers (47) is "
                                          "not a multiple of it"),
    (MAVERICK, {"moe_layers": [1, 3, 5]}, "moe_layers = [1, 3, 5] is not supported: genconf places one MoE layer in "
                                          "every interleave_moe_layer_step (2): layers 1, 3, ..., 47"),
    (SCOUT, {"moe_layers": list(range(1, 48, 2))}, "layers 0, 1, ..., 47"),
    (SCOUT, {"no_rope_layers": [1, 0]}, "no_rope_layers = [1, 0] is not supported: one 0 (NoPE) or 1 (RoPE) per layer"),
    (SCOUT, {"attention_bias": True}, "attention_bias = true is not supported: this family's MLP has no bias"),
    (SCOUT, {"layer_types": ["sliding_attention"] * 48}, "layer_types = [\"sliding_attention\""),
    (SCOUT, {"shared_expert_gate": True}, "text_config: field 'shared_expert_gate' is not one genconf knows for "
                                          "Llama4ForConditionalGeneration"),
])
def test_llama4_what_cannot_be_represented_is_one_line(tmp_path, name, changes, needle):
    path = tmp_path / "m" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(_llama4(name, **changes)))
    out = subprocess.run(genconf_cmd() + ["--model", str(path), "--gpus", "64"], capture_output=True, text=True,
                         cwd=REPO, timeout=60)
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and needle in out.stderr and str(path) in out.stderr, out.stderr


def test_llama4_s_top_level_is_checked_too():
    data = _llama4(MAVERICK)
    for changes, needle in (({"text_config": None}, "keeps its text decoder's fields in an object text_config"),
                            ({"audio_config": {}}, "field 'audio_config' is not one genconf knows"),
                            ({"tie_word_embeddings": True}, 'tie_word_embeddings = true is not supported: text_config '
                                                            'says false')):
        if "tie_word_embeddings" in changes:
            data["text_config"]["tie_word_embeddings"] = False
        with pytest.raises(GenconfError, match=re.escape(needle)):
            hf.model_from_config(data | changes, name="m", where="c")
    # A top-level tie_word_embeddings (Llama4Config's) is the text decoder's where text_config has none.
    data["text_config"].pop("tie_word_embeddings")
    assert hf.model_from_config(data | {"tie_word_embeddings": True}, name="m", where="c")[0].tie_embeddings


@needs_megatron
def test_megatron_core_builds_llama4_s_text_decoders():
    """megatron-core's GPTModel of the imports on the meta device (local spec, --moe-layer-freq from
    moe_layer_interval, shared experts): the planned rank's parameters, which are the checkpoint's text decoder with
    its vocabulary of 202,048 padded to 202,112 (a multiple of 128) in the embedding and the output layer."""
    names = [MAVERICK, SCOUT]
    out = subprocess.run([sys.executable, "-m", "genconf.train.meta_count", *[str(HF / n) for n in names], "--json"],
                         capture_output=True, text=True, cwd=REPO, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for name in names:
        padding = 2 * (202_112 - 202_048) * 5120
        assert result[name]["checkpoint"] == TEXT_DECODER_COUNTS[name], (name, result[name])
        assert result[name]["built"] == result[name]["planned"] == TEXT_DECODER_COUNTS[name] + padding, name
