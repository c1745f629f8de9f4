"""The report of ``python -m demo diversity``: ``diversity.md``, the tables of :mod:`demo.diversity_study`'s result.

One section per measurement, numbered as the study's docstring numbers them. A cell reads ``mean +- s.e.``
(``mean`` alone with one value, ``-`` where there is none: an edit with no response, a line read outside
its range).
"""

from __future__ import annotations

from collections.abc import Mapping

from demo.diversity_measures import MIN_WORDS


def pm(stat: Mapping | None, digits: int = 3, sign: bool = False) -> str:
    """``mean +- se`` of a :func:`demo.diversity_measures.stat` (``+`` shown on positive means with ``sign``)."""
    if stat is None:
        return "-"
    mean = f"{stat['mean']:+.{digits}f}" if sign else f"{stat['mean']:.{digits}f}"
    return mean if stat["se"] is None else f"{mean} +- {stat['se']:.{digits}f}"


def _n(stat: Mapping | None) -> str:
    return "-" if stat is None else str(stat["n"])


def repetition_lines(rep: Mapping, config: Mapping) -> list[str]:
    """Section 1: the correlations (1a) and the edits (1b)."""
    s, c = rep["samples"], rep["correlation"]
    lines = [
        "## 1a. Does the reward model prefer repetition? Within-prompt correlations on fresh SFT samples",
        "",
        f"{s['responses']} responses ({s['prompts']} held-out prompts x K = {s['k']}, seed {config['seed']}, "
        f"{config['max_new_tokens']} new tokens), {s['words_mean']:.1f} words on average; their own distinct-2 averages "
        f"{s['distinct2_within_mean']:.3f} and {s['fraction_repeating_a_bigram']:.1%} repeat a bigram of their own. "
        "RM as PPO reads it (EOS appended to a cut response), judge VADER.",
        "",
        "| within-prompt Spearman (mean +- s.e. over prompts) | prompts | RM | judge |",
        "|---|---|---|---|",
    ]
    for x, label in (
        ("distinct2_within", "own distinct-2"),
        ("distinct1_within", "own distinct-1"),
        ("words", "words"),
    ):
        rm, judge = c[f"rm_vs_{x}"], c[f"judge_vs_{x}"]
        lines.append(f"| vs {label} | {_n(rm)} | {pm(rm, sign=True)} | {pm(judge, sign=True)} |")
    lines += [f"| RM vs judge | {_n(c['rm_vs_judge'])} | {pm(c['rm_vs_judge'], sign=True)} | |", ""]
    lines += [
        "## 1b. Edits of the last third, word count kept",
        "",
        f"{rep['intervention']['edited_responses']} responses of >= {MIN_WORDS} words; edited and original texts rescored "
        f"alike (prompt + response as one string, EOS appended; this rescoring correlates "
        f"{s['rescored_rm_correlation']:.4f} with the sampled tokens' RM score). Changes in units of each score's "
        f"std over the SFT samples (RM {s['rm_std']:.3f}, judge {s['judge_std']:.3f}); per-prompt means, then "
        "mean +- s.e. over prompts.",
        "",
        "| edit | responses | prompts | own distinct-2 change | RM change (std) | judge change (std) | RM minus judge |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, e in rep["intervention"]["edits"].items():
        lines.append(
            f"| {name} | {e['n_responses']} | {_n(e['d_rm_z'])} | {pm(e['d_distinct2_within'], sign=True)} "
            f"| {pm(e['d_rm_z'], sign=True)} | {pm(e['d_judge_z'], sign=True)} "
            f"| {pm(e['d_rm_minus_d_judge_z'], sign=True)} |"
        )
    return lines + [""]


def best_of_n_lines(bon: Mapping) -> list[str]:
    """Section 2: best-of-N picked by the RM against picked by the judge."""
    c = bon["correlation"]
    lines = [
        "## 2. Best-of-N picked by the RM and by the judge (the demo's best-of-N samples)",
        "",
        f"{bon['prompts']} prompts, {bon['samples']} SFT samples. One pick per prompt in each disjoint subset of N "
        f"samples; distinct-2 of the picks relative to N = 1's ({bon['base_distinct2']:.3f}), its factors likewise; "
        "mean +- s.e. over subsets. KL: the analytic bound log N - (N-1)/N.",
        "",
        "| N | KL | subsets | by RM: d2 ratio | within | across | judge | by judge: d2 ratio | within | across | judge "
        "| RM's d2 ratio minus judge's (paired) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for n, row in bon["by_n"].items():
        cells = [
            f"{pm(row[k]['d2_ratio'])} | {pm(row[k]['within_ratio'])} | {pm(row[k]['across_ratio'])} "
            f"| {pm(row[k]['judge'])}"
            for k in ("rm", "judge")
        ]
        diff = row["d2_ratio_rm_minus_judge"]
        lines.append(
            f"| {n} | {row['kl_analytic']:.2f} | {_n(diff)} | {cells[0]} | {cells[1]} | {pm(diff, sign=True)} |"
        )
    lines += [
        "",
        f"Section 1a on these samples: Spearman with own distinct-2, RM {pm(c['rm_vs_distinct2_within'], sign=True)}, "
        f"judge {pm(c['judge_vs_distinct2_within'], sign=True)} ({_n(c['rm_vs_distinct2_within'])} prompts).",
        "",
    ]
    return lines


def _grown(entries: list[Mapping], top: int) -> str:
    return ", ".join(f'"{e["ngram"]}" {e["per_run"]:.0f} ({e["sft"]})' for e in entries[:top])


def decomposition_lines(dec: Mapping, config: Mapping) -> list[str]:
    """Section 3: each evaluation's distinct-2 split within / across, what grew, and the equal-KL / judge readings."""
    sft = dec["sft"]
    lines = [
        "## 3. Where distinct-2 falls: within responses or across them",
        "",
        f"SFT: distinct-2 {sft['distinct_2']:.3f} = within {sft['within']:.4f} x across {sft['across']:.3f} "
        "(distinct-2 = U / T = (W / T) (U / W): T all bigrams, W each response's distinct bigrams summed, U the "
        "set's distinct bigrams). Ratios to SFT's, mean +- s.e. over seeds; the last column is the share of "
        "log(d2 ratio) in the across factor.",
        "",
        "| variant | checkpoint | seeds | KL | judge | d2 / SFT | within / SFT | across / SFT | share across |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, v in dec["variants"].items():
        for checkpoint, c in v["checkpoints"].items():
            lines.append(
                f"| {name} | {checkpoint} | {_n(c['kl'])} | {pm(c['kl'], 2)} | {pm(c['judge'])} | {pm(c['d2_ratio'])} "
                f"| {pm(c['within_ratio'])} | {pm(c['across_ratio'])} | {pm(c['share_across'], 2)} |"
            )
    lines += [
        "",
        "What grew from SFT to the final policies, count per evaluation (mean over seeds; SFT's in parentheses):",
        "",
    ]
    for name, v in dec["variants"].items():
        b = v["grown_bigrams"]
        lines.append(
            f"- `{name}`: words {_grown(v['grown_words']['ngrams'], 5)}; bigrams {_grown(b['ngrams'], 8)}; "
            f"the {len(b['ngrams'])} fastest-growing bigrams are {b['share']:.1%} of all (SFT {b['share_sft']:.1%}); "
            f"responses using a word 3+ times {v['repeats_a_word']:.1%} (SFT {sft['repeats_a_word']:.1%})."
        )
    lines += [
        "",
        "distinct-2 / SFT's at equal held-out KL and judge score: a line per variant through every checkpoint "
        "of every seed (s.e.: seeds resampled, optimistic with few; - outside the variant's range).",
        "",
        "| variant | "
        + " | ".join([f"KL {x}" for x in config["at_kl"]] + [f"judge {x}" for x in config["at_judge"]])
        + " |",
        "|---|" + "---|" * (len(config["at_kl"]) + len(config["at_judge"])),
    ]
    for name, v in dec["variants"].items():
        if "d2_ratio_at_kl" in v:
            cells = [*v["d2_ratio_at_kl"].values(), *v["d2_ratio_at_judge"].values()]
            lines.append(f"| {name} | " + " | ".join(pm(c) for c in cells) + " |")
    return lines + [""]


def entropy_lines(ent: Mapping, config: Mapping) -> list[str]:
    """Section 4: rollout entropy over training, its fall, and at equal rollout KL."""
    if not ent:
        return []
    rollouts = list(next(iter(ent.values()))["windows"])
    w = config["window"]
    lines = [
        "## 4. Entropy over rollouts",
        "",
        f"`objective/entropy` (nats/token, before each update): rollout 1 alone, else the mean of the {w} rollouts "
        f"ending there; mean +- s.e. over seeds. Fall: first {w} rollouts minus last {w}, and per nat of the last "
        f"{w} rollouts' KL. At rollout KL: a line per variant through the rollouts after the first {w}.",
        "",
        "| variant | "
        + " | ".join(f"rollout {r}" for r in rollouts)
        + " | fall | fall per nat | "
        + " | ".join(f"at KL {x}" for x in config["at_kl"])
        + " |",
        "|---|" + "---|" * (len(rollouts) + 2 + len(config["at_kl"])),
    ]
    for name, v in ent.items():
        cells = [pm(v["windows"].get(r)) for r in rollouts] + [pm(v["fall"]), pm(v["fall_per_nat"])]
        lines.append(f"| {name} | " + " | ".join(cells + [pm(c) for c in v["at_kl"].values()]) + " |")
    return lines + [""]


def markdown(result: Mapping) -> str:
    """``diversity.md``: the setup line, then sections 1 to 4."""
    config = result["config"]
    return "\n".join(
        [
            "# Why held-out distinct-2 falls",
            "",
            f"`python -m demo diversity --demo {config['demo']} --study {config['study']} --prompts {config['prompts']} "
            f"--k {config['k']} --seed {config['seed']}` ({result['seconds']:.0f} s).",
            "",
            *repetition_lines(result["repetition"], config),
            *best_of_n_lines(result["best_of_n"]),
            *decomposition_lines(result["decomposition"], config),
            *entropy_lines(result["entropy"], config),
        ]
    )
