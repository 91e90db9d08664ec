"""The sizes a transformer family's configs decide (SD3, SD3.5; Flux and Chroma read the same keys): each text
encoder's width, vocabulary and pooled projection, the transformer's text width and pooled width, checked against
each other so a mismatched folder fails before anything is traced."""

from __future__ import annotations

from dataclasses import replace

from enginefarm.errors import ConfigError
from enginefarm.families import Family, Sizes
from enginefarm.families.spec import TEXT_LENGTH_MAX, TEXT_LENGTH_MIN


def encoder_width(config: dict) -> int:
    """CLIP says hidden_size, T5 d_model."""
    return int(config.get("hidden_size") or config["d_model"])


def transformer_sizes(family: Family, configs: dict[str, dict]) -> Sizes:
    transformer, joint, table = configs["transformer"], family.joint_text, family.sizes
    assert joint is not None, f"{family.id} has a transformer, so it declares its joint text"
    cross = int(transformer["joint_attention_dim"])
    widths, vocabs, projections = [], [], []
    for index, name in enumerate(family.text_encoders):
        config = configs.get(name)
        if config is None:  # an optional encoder the model ships without: the pipeline feeds zeros of its shape
            widths.append(cross if name in joint.tokens else table.text_widths[index])
            vocabs.append(table.vocab_sizes[index] if table.vocab_sizes else table.vocab_size)
            projections.append(0)
            continue
        widths.append(encoder_width(config))
        vocabs.append(int(config["vocab_size"]))
        # CLIPTextModelWithProjection's text_embeds are projection_dim wide; CLIPTextModel's pooler_output (Flux) is its
        # width
        pooler = any(t.name == "pooler_output" for t in family.component(name).outputs)
        projections.append(
            (widths[-1] if pooler else int(config.get("projection_dim") or widths[-1])) if name in joint.pooled else 0
        )
    side_by_side = sum(w for n, w in zip(family.text_encoders, widths, strict=True) if n in joint.width)
    if side_by_side > cross:
        raise ConfigError(
            f"the text encoders {', '.join(joint.width)} are {side_by_side} wide together, more than the transformer's "
            f"joint_attention_dim {cross}",
            hint="the text encoders do not belong to this transformer",
        )
    for name, width in zip(family.text_encoders, widths, strict=True):
        if name in joint.tokens and width != cross:
            raise ConfigError(
                f"{name} is {width} wide, the transformer's joint_attention_dim is {cross}",
                hint="the text encoders do not belong to this transformer",
            )
    pooled = sum(projections)
    expected = int(transformer.get("pooled_projection_dim") or 0)
    if joint.pooled and pooled != expected:
        raise ConfigError(
            f"the text encoders' pooled projections add up to {pooled}, the transformer's pooled_projection_dim is "
            f"{expected}",
            hint="the text encoders do not belong to this transformer",
        )
    lengths = table.text_lengths or tuple(77 for _ in family.text_encoders)
    by_name = dict(zip(family.text_encoders, lengths, strict=True))
    context = max((by_name[n] for n in joint.width), default=0) + sum(by_name[n] for n in joint.tokens)
    vae = configs.get("vae", {})
    return Sizes(
        text_widths=tuple(widths),
        cross_attention_dim=cross,
        latent_channels=int(vae.get("latent_channels") or transformer.get("in_channels", table.latent_channels)),
        pooled_width=pooled,
        vocab_size=vocabs[0] if vocabs else table.vocab_size,
        num_train_timesteps=int(configs.get("scheduler", {}).get("num_train_timesteps", 1000)),
        text_lengths=tuple(lengths),
        vocab_sizes=tuple(vocabs),
        projection_widths=tuple(projections),
        context_tokens=context,
    )


def with_text_length(family: Family, sizes: Sizes, text_length: tuple[int, int, int] | None) -> Sizes:
    """`sizes` with the T5 token range's opt as the default count (`--text-length MIN,OPT,MAX`): the count the
    pipeline reads when a call does not choose one, and the one the export traces at."""
    if text_length is None:
        return sizes
    t5 = [c for c in family.components if c.tokenizer == "t5"]
    if not t5:
        raise ConfigError(
            f"{family.title} has no T5 encoder: its text length is CLIP's fixed 77", hint="leave out --text-length"
        )
    low, opt, high = text_length
    if high > TEXT_LENGTH_MAX:
        raise ConfigError(
            f"--text-length {low},{opt},{high} goes past {TEXT_LENGTH_MAX} tokens, what T5 was trained at and "
            "diffusers allows",
            hint=f"e.g. --text-length {TEXT_LENGTH_MIN},{min(opt, TEXT_LENGTH_MAX)},{TEXT_LENGTH_MAX}",
        )
    lengths = list(sizes.text_lengths)
    for component in t5:
        lengths[component.text_index] = opt
    return replace(sizes, text_lengths=tuple(lengths), context_tokens=sizes.context_for(family, opt))
