"""Regenerate BENCHMARKS.md from benchmarks/results: every script's table, the convergence
runs and their loss against bytes (its figure drawn here), and ``gact-fx bench``'s own
files (the suite, the GPU suite).

    python benchmarks/report.py
"""

from __future__ import annotations

import pathlib
import sys

from gact_fx.bench import plots, tradeoff
from gact_fx.bench.markdown import HIGHER_IS_BETTER, TABLES, load_result, write_markdown

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent.parent))
from benchmarks._results import RESULTS  # noqa: E402

# Each script's result file that carries a ready table: its section's title and note.
TABLE_FILES = {
    "gpu_step_profile.json": ("GPU step profile: where gact's step time goes",
                              "`benchmarks/gpu_step_profile.py`: the GPU suite's Llama-like step under the CUDA "
                              "profiler, gact at 2 bits against torch.compile; the profiler's tables are in "
                              "`benchmarks/results/gpu_step_profile/`."),
    "gpu_suite_first.json": ("GPU suite: the first run", "`gact-fx bench --gpu-suite` on the first lent H100, "
                             "commit f6bae9e."),
    "gpu_suite_second.json": ("GPU suite: the second run", "`gact-fx bench --gpu-suite` on the second lent H100, "
                              "commit 3868241."),
    "gpu_step_profile_first.json": ("GPU step profile: the first run",
                                    "`benchmarks/gpu_step_profile.py` after the GPU suite's second run; the "
                                    "profiler's tables are in `benchmarks/results/gpu_step_profile_first/`."),
    "replay_gradient_error.json": ("Gradient error along a run: spikes, the model's or the compression's",
                                   "`benchmarks/replay_gradient_error.py`: the first steps of a convergence run "
                                   "replayed (same task, seeds and schedule), each step's compressed gradient "
                                   "against the exact one at the same weights and batch. Error: ||g - g_exact|| / "
                                   "||g_exact||."),
    "gradient_variance.json": ("Gradient variance: uniform against adaptive bits",
                               "Relative variance E||g - g_exact||^2 / ||g_exact||^2 over rounding seeds."),
    "adaptive_overhead.json": ("Cost of adaptive bits", "A probe step against a normal step, amortised over the interval."),
    "cpu_step_time.json": ("CPU step time of the gact backend", "Ratios against the same compile path with gact disabled."),
    "cpu_step_time_feature_groups.json": ("CPU step time with feature groups",
                                          "`feature_groups=True` against contiguous groups, in the same run. The "
                                          "CPU codec reads and writes the tensor's own layout (no transposed copy) "
                                          "where its tokens fill whole groups and its features come in eights."),
    "cpu_step_time_rotation.json": ("CPU step time with the rotation",
                                    "`rotation=32` against none, at 3 bits under Inductor, in the same run: the "
                                    "rotation is a torch matmul around the C++ codec."),
    "cpu_step_time_dithered.json": ("CPU step time with dithered rounding",
                                    "`rounding='dithered'` against stochastic rounding, at 3 bits under Inductor, in "
                                    "the same run: the C++ codec's decode draws the noise again."),
    "compile_time.json": ("Compile time on the CPU: gact against plain Inductor, cold and warm",
                          "`benchmarks/compile_time.py`: the first training step (forward and backward, both "
                          "compiled) in a fresh process per run, on an empty Inductor cache (cold: every kernel "
                          "built, gact's CPU codec too) and again on the cache the cold run filled (warm)."),
    "compile_time_adaptive.json": ("Compile time on the CPU: adaptive bits",
                                   "`benchmarks/compile_time.py --models bert llama-base --bits 2 --levels L2.2 "
                                   "--repeats 1 --steps 3 --name compile_time_adaptive`: as above, with an adaptive "
                                   "level, whose first two steps are sensitivity probes."),
    "cpu_peak_memory.json": ("Peak step memory on the CPU: transformers at base width",
                             "`benchmarks/cpu_peak_memory.py`: one training step per method, the caller keeping only the "
                             "loss; peak from the CPU profiler's allocation events, above what was live before the step."),
    "cpu_peak_memory_batch8.json": ("Peak step memory on the CPU: the same at twice the batch",
                                    "`benchmarks/cpu_peak_memory.py --batch 8`: as above, with twice the tokens per step."),
    "cpu_peak_memory_base.json": ("Peak step memory on the CPU: the zoo's base size",
                                  "`benchmarks/cpu_peak_memory.py --layers 12 --sequence 512 --batch 16`: the zoo's base "
                                  "size (12 layers, hidden 768, batch 16 x 512 tokens), otherwise as above."),
    "cpu_peak_memory_base_bert.json": ("Peak step memory on the CPU: every method on BERT at the zoo's base size",
                                       "`benchmarks/cpu_peak_memory.py --models bert --layers 12 --sequence 512 "
                                       "--batch 16 --steps 1 --name cpu_peak_memory_base_bert`."),
    "cpu_step_base_inductor.json": ("Step time on the CPU under Inductor: transformers at base width",
                                    "`benchmarks/cpu_peak_memory.py --methods torch.compile 'gact 2 bit' 'gact L2.2 "
                                    "(adaptive 2)' --compiler inductor --steps 5 --name cpu_step_base_inductor`: the table "
                                    "above, compiled by Inductor, with adaptive bits."),
    "kernels.json": ("Kernels: quantize / dequantize bandwidth and step time",
                     "Against the faster of two copies of the same tensor on the same device: into a new tensor, and "
                     "into a buffer allocated once."),
    "kernels_cpu_2threads.json": ("Kernels on two CPU threads",
                                  "`benchmarks/kernels.py --skip-steps --threads 2 --name kernels_cpu_2threads`: the "
                                  "codec's groups split over torch's threads, the copies likewise."),
    "kernels_cpu_large.json": ("Kernels on large CPU tensors", "`benchmarks/kernels.py --skip-steps --numel 33554432 "
                               "--name kernels_cpu_large`: 32M elements, larger than the caches, as saved activations of "
                               "base-size models are (BERT-base's attention probabilities at batch 16 x 512: 48M)."),
    "kernels_cpu_large_thp.json": ("Kernels on large CPU tensors, with huge pages",
                                   "`THP_MEM_ALLOC_ENABLE=1 benchmarks/kernels.py --skip-steps --numel 33554432 --name "
                                   "kernels_cpu_large_thp`: as above, with torch's CPU allocator asking for transparent "
                                   "huge pages, so that a fresh allocation faults once per 2 MB instead of once per 4 KB."),
    "warm_gradient_error_groups.json": ("Gradient error against bytes: widths and group sizes",
                                        "One draw's gradient error on the Llama after 300 fp32 steps, each width at each "
                                        "group size; the activation bytes include each group's metadata and the "
                                        "attention floors (8 bits). Measured with the float32 scale and min of the time "
                                        "(8 bytes a group), as are the floors and rotation tables below; 'bfloat16 "
                                        "group words' has the format of today (4)."),
    "warm_gradient_error_floors.json": ("Gradient error against bytes: attention floors and adaptive levels",
                                        "As above: uniform widths with attention's floors at 4 bits instead of 8 "
                                        "(`nonlinear_bits=4`), beside the adaptive levels."),
    "warm_gradient_error_rotation.json": ("Gradient error against bytes: a random-sign Hadamard rotation",
                                          "As above, each configuration without and with `rotation=32` (blocks of 32 "
                                          "along the innermost dimension rotated before rounding), at groups of 256 "
                                          "and 64. Same bytes; the error is what changes."),
    "warm_gradient_error_rotation_gpt.json": ("Gradient error against bytes: the rotation on the char GPT",
                                              "As above, on the character GPT after 300 fp32 steps (`--task charlm`)."),
    "warm_gradient_error_metadata.json": ("Gradient error against bytes: bfloat16 group words",
                                          "`benchmarks/warm_gradient_error.py --task charlm-llama --configs 'uniform 4' "
                                          "'uniform 3' 'uniform 2' --group-sizes 64 128 256 --rotations 0 32 --name "
                                          "warm_gradient_error_metadata`: the format with each group's min and half range "
                                          "stored as bfloat16s (4 bytes a group, where the tables above held 8). Against "
                                          "them: the same error at each width and group size, in fewer bytes."),
    "warm_gradient_error_bert.json": ("Gradient error against bytes: a BERT-like masked LM",
                                      "`benchmarks/warm_gradient_error.py --task charlm-bert --configs 'uniform 4' "
                                      "'uniform 3' 'uniform 2' 'uniform 3, attention floor 4' --group-sizes 128 256 "
                                      "--rotations 0 32 --name warm_gradient_error_bert`: the masked LM (ModernBERT over "
                                      "bytes) after 300 fp32 steps, in today's format (bfloat16 group words)."),
    "warm_gradient_error_noise_bert.json": ("Gradient error against the minibatch's noise: the masked LM",
                                            "`benchmarks/warm_gradient_error.py --task charlm-bert --configs ... --name "
                                            "warm_gradient_error_noise_bert`: the masked LM after 300 fp32 steps. 'variance "
                                            "added / minibatch's': the variance one compressed draw adds to the gradient, "
                                            "over the variance of one batch's exact gradient about the mean of 16 batches at "
                                            "the same weights; then the same at the parameter tensor where it is largest."),
    "warm_gradient_error_noise_llama.json": ("Gradient error against the minibatch's noise: the Llama",
                                             "As above, `--task charlm-llama`."),
    "warm_gradient_error_noise_gpt.json": ("Gradient error against the minibatch's noise: the char GPT",
                                           "As above, `--task charlm`."),
    "warm_gradient_error_adaptive_bert.json": ("Gradient error against the minibatch's noise: adaptive levels on the masked LM",
                                               "As above, `--task charlm-bert`, the adaptive levels with feature groups "
                                               "between L2.1 and L2.2 (each tensor probed once, then frozen), with the "
                                               "absolute and the relative gradient metric, beside uniform 4 and 3 bits."),
    "warm_gradient_error_floor4_bert.json": ("Gradient error against the minibatch's noise: attention's floor at 4 bits on the masked LM",
                                             "As above, `--task charlm-bert`: attention's query and key at 4 bits "
                                             "(`nonlinear_bits=4`) where the default keeps them at 8, uniform and "
                                             "adaptive (each tensor probed once, then frozen), and the rotation on top "
                                             "of feature groups. Query and key at 4 bits bias the gradient (the next "
                                             "table), so these rows are a bound on bytes, not candidates."),
    "warm_gradient_error_bert_late.json": ("Gradient error against the minibatch's noise: the masked LM late in training",
                                           "`benchmarks/warm_gradient_error.py --task charlm-bert --warmup 1500 --configs "
                                           "'uniform 4, feature groups' 'uniform 4, feature groups, dithered' 'uniform 3, "
                                           "feature groups, dithered, projections rebuilt' --draws 16 --name "
                                           "warm_gradient_error_bert_late`: as above after 1500 fp32 steps, beside the same "
                                           "after 300 (the next table). 'elements above the minibatch's': the share of "
                                           "gradient elements where one draw adds more variance than the minibatch has, "
                                           "where Adam's per-element scale sees mostly rounding noise."),
    "warm_gradient_error_bert_early.json": ("Gradient error against the minibatch's noise: the masked LM early in training",
                                            "The same three configurations after 300 fp32 steps (`--warmup 300 ... --name "
                                            "warm_gradient_error_bert_early`)."),
    "warm_gradient_error_bias_bert_late.json": ("Gradient bias: the masked LM late in training",
                                                "`benchmarks/warm_gradient_error.py --task charlm-bert --warmup 1500 "
                                                "--configs 'uniform 4, feature groups' --draws 64 --name "
                                                "warm_gradient_error_bias_bert_late`: today's default after 1500 fp32 "
                                                "steps with 64 draws, so that the mean's error resolves a bias of a "
                                                "percent of the gradient (16 draws put it at 1.04 there, 1.00 after 300 "
                                                "steps); then the same with attention's query and key exact "
                                                "(`nonlinear_bits=32`) instead of at their 8-bit floor."),
    "warm_gradient_error_groups_bert.json": ("Gradient error against the minibatch's noise: group sizes with feature groups on the masked LM",
                                             "As above, `--task charlm-bert --group-sizes 64 128 256 512`: 3 and 4 bits "
                                             "grouped along features at each group size (tokens of one feature a group). "
                                             "No point near 10x comes near 4 bits' error at 256."),
    "warm_gradient_error_bias_bert.json": ("Gradient bias: attention's query and key at 4 bits on the masked LM",
                                           "`benchmarks/warm_gradient_error.py --task charlm-bert --configs 'uniform 4, "
                                           "feature groups' 'uniform 4, feature groups, attention floor 4' --draws 64`: "
                                           "as above with 64 draws, so that the mean's error resolves a bias of a few "
                                           "percent of the gradient: unbiased, it stays near 1x the averaging floor. "
                                           "Then the adaptive levels likewise: their loss on the masked LM is not "
                                           "a bias."),
    "warm_gradient_error_dither_bert.json": ("Gradient error against the minibatch's noise: dithered rounding on the masked LM",
                                             "`benchmarks/warm_gradient_error.py --task charlm-bert --configs 'uniform 4, "
                                             "feature groups' 'uniform 4, feature groups, dithered' ... --name "
                                             "warm_gradient_error_dither_bert`: each width with stochastic rounding and "
                                             "with `rounding='dithered'` (the same codes; the decoder subtracts the "
                                             "noise again), same bytes but 8 a tensor. The variance added halves at "
                                             "every width and the mean stays at the averaging floor."),
    "warm_gradient_error_dither_llama.json": ("Gradient error against the minibatch's noise: dithered rounding on the Llama",
                                              "As above, `--task charlm-llama`."),
    "warm_gradient_error_dither_gpt.json": ("Gradient error against the minibatch's noise: dithered rounding on the char GPT",
                                            "As above, `--task charlm`."),
    "warm_gradient_error_dither_adaptive_bert.json": ("Gradient error against the minibatch's noise: adaptive levels "
                                                      "dithered on the masked LM",
                                                      "As above, `--task charlm-bert`: `L2.2` and adaptive 2.5 bits with "
                                                      "feature groups (each tensor probed once, then frozen), with "
                                                      "stochastic and with dithered rounding."),
    "warm_gradient_error_debias_bert.json": ("Gradient bias: query and key at 4 bits, dithered and debiased, on the masked LM",
                                             "`benchmarks/warm_gradient_error.py --task charlm-bert --draws 64`: query and "
                                             "key at 4 bits (`nonlinear_bits=4`) with stochastic rounding, dithered, and "
                                             "dithered with `debias_attention` (each attention backward also run at query "
                                             "and key shifted by a second draw of their noise, `passes.debias`). 64 draws, "
                                             "so that the mean's error resolves a bias of a few percent; the last two rows "
                                             "ran in a second process on the same warm model."),
    "warm_gradient_error_debias_gpt.json": ("Gradient bias: query and key at 4 bits, dithered and debiased, on the char GPT",
                                            "As above, `--task charlm`; the first rows' configurations differ."),
    "warm_gradient_error_debias_llama.json": ("Gradient bias: query and key at 4 bits, dithered and debiased, on the Llama",
                                              "As above, `--task charlm-llama`. The residual above the averaging floor "
                                              "after debiasing is not all query and key's: 3 bits with them at 8 sit at "
                                              "1.15x too."),
    "warm_gradient_error_statistics_llama.json": ("Gradient error: norms' row statistics exact or rounded, on the Llama",
                                                  "`benchmarks/warm_gradient_error.py --task charlm-llama --draws 64 "
                                                  "--statistics exact rounded`: each configuration with RMSNorm's "
                                                  "`rsqrt` kept exact (`exact_statistics`, the default since "
                                                  "2026-11-27) and rounded with the rest (what every earlier table "
                                                  "did)."),
    "warm_gradient_error_statistics_bert.json": ("Gradient error: norms' row statistics exact or rounded, on the masked LM",
                                                 "As above, `--task charlm-bert`: LayerNorm's mean and reciprocal "
                                                 "standard deviation."),
    "warm_gradient_error_statistics_gpt.json": ("Gradient error: norms' row statistics exact or rounded, on the char GPT",
                                                "As above, `--task charlm`."),
    "warm_gradient_error_adaptive_debias_bert.json": ("Gradient error: adaptive 2.5 bits with query and key at 4, "
                                                      "debiased, on the masked LM",
                                                      "`benchmarks/warm_gradient_error.py --task charlm-bert --draws "
                                                      "64`: adaptive 2.5 bits with feature groups, the relative metric "
                                                      "and dithered rounding (each tensor probed once, then frozen), "
                                                      "with query and key at 8 bits and at 4 with `debias_attention`; "
                                                      "row statistics exact in both."),
    "warm_gradient_error_qk_rotation_bert.json": ("Gradient error: query and key rotated (`nonlinear_rotation=32`), "
                                                  "on the masked LM",
                                                  "`benchmarks/warm_gradient_error.py --task charlm-bert --draws 64`: 3 "
                                                  "bits with feature groups, dithered, query and key at 4 bits rotated "
                                                  "by a random-sign Hadamard over a head's 32 dimensions before "
                                                  "rounding, with and without `debias_attention`; row statistics "
                                                  "exact. Without the rotation: \"Gradient error: norms' row "
                                                  "statistics exact or rounded\"."),
    "warm_gradient_error_qk_rotation_llama.json": ("Gradient error: query and key rotated (`nonlinear_rotation=32`), "
                                                   "on the Llama", "As above, `--task charlm-llama`."),
    "warm_gradient_error_qk_rotation_gpt.json": ("Gradient error: query and key rotated (`nonlinear_rotation=32`), "
                                                 "on the char GPT", "As above, `--task charlm`."),
    "warm_gradient_error_adaptive_rotated_llama.json": (
        "Gradient error: adaptive bits with query and key at 4 bits, rotated and debiased, on the Llama",
        "`benchmarks/warm_gradient_error.py --task charlm-llama --draws 64`: the adaptive solver (relative metric, "
        "every tensor probed once) at 2.25, 2.5 and 2.75 bits on average, feature groups, dithered, query and key "
        "floored at 4 bits, rotated (`nonlinear_rotation=32`) and debiased. The budget counts the elements the "
        "backward rebuilds (`passes.affine`), so an average of 2.75 holds fewer bytes than uniform 3 bits (11.3x "
        "with the same options, one draw's error 0.200)."),
    "warm_gradient_error_adaptive_rotated_gpt.json": (
        "Gradient error: adaptive bits with query and key at 4 bits, rotated and debiased, on the char GPT",
        "As above, `--task charlm` (uniform 3 bits with the same options: 11.2x, one draw's error 0.165)."),
    "warm_gradient_error_bytes_llama.json": (
        "Gradient error: adaptive bits over every byte held, on the Llama",
        "`benchmarks/warm_gradient_error.py --task charlm-llama --draws 64`: the adaptive solver at 2.65 bits a "
        "full-precision element over every byte the saved activations hold (`budget=\"bytes\"`: 12.1x on any "
        "model), relative metric, every tensor probed once, feature groups, dithered; query and key floored at 4 "
        "bits, rotated and debiased, or at their default floor of 8 bits, paid from the same bytes."),
    **{f"format_variance_{name}.json": (
        f"2-bit formats against today's: rounding variance on the {model}",
        f"`benchmarks/format_variance.py --task {task} --name format_variance_{name}`: a static model of each "
        "candidate format (closed-form rounding variance over the warm model's saved activations), not a gradient "
        "measurement.")
       for name, model, task in (("gpt", "char GPT", "charlm"), ("llama", "Llama", "charlm-llama"),
                                 ("bert", "masked LM", "charlm-bert"))},
    "format_variance_bert_late.json": (
        "2-bit formats against today's: rounding variance on the masked LM late in training",
        "`benchmarks/format_variance.py --task charlm-bert --warmup 1500`: as the masked LM's table above, after "
        "1500 fp32 steps instead of 300, where the warm screen found each draw's gradient error twice as large."),
    **{f"warm_gradient_error_projections_{name}.json": (
        f"Gradient error: attention's value rebuilt from the QKV projection's input, on the {model}",
        f"`benchmarks/warm_gradient_error.py --task {task} --draws 16 --configs ... --name "
        f"warm_gradient_error_projections_{name}`: each configuration with and without `recompute_projections`, "
        "after 300 fp32 steps; the adaptive one at 2.65 bits over every byte held (12.1x on any model), so the "
        "value's bytes go to the other tensors.")
       for name, model, task in (("gpt", "char GPT", "charlm"), ("llama", "Llama", "charlm-llama"),
                                 ("bert", "masked LM", "charlm-bert"))},
    "rebuild_flops.json": ("What rebuilding attention's value adds to a step, in FLOPs",
                           "`python benchmarks/rebuild_flops.py --name rebuild_flops`: one eager training step's "
                           "FLOPs (`torch.utils.flop_counter`) and those of the matmuls the backward runs again "
                           "with `recompute_projections` (3 bits dithered), the fused QKV projection narrowed to "
                           "the value's columns and whole. A count, not a timing."),
    "cpu_step_time_debiased.json": ("CPU step time with query and key at 4 bits, debiased",
                                    "`benchmarks/cpu_step_time.py --models char-gpt block --compilers inductor --bits 3 "
                                    "--dithered --debiased --name cpu_step_time_debiased`: `debias_attention` runs two "
                                    "attention forwards and backwards more per layer in the backward; measured beside a "
                                    "training run on the other core."),
    "feature_groups_error.json": ("Gradient error: groups along features where the innermost dimension is not one",
                                  "`benchmarks/feature_groups_error.py --name feature_groups_error`: one draw's "
                                  "gradient error at init with `feature_groups` on and off, on the CNNs, the MLP and "
                                  "the ViT."),
    "static_kernels.json": ("GPU kernels, static: instructions per element against the memory-speed budget",
                            "`python benchmarks/static_kernels.py`: every variant the CUDA path launches, compiled "
                            "for sm_90 and read back with cuobjdump on this CPU machine. A static model: the GPU "
                            "suite's measured kernel table is the test of it, and its first run (H100, "
                            "2026-11-27) found the kernels at 15-61% of a device copy where this model bounds "
                            "100%: the instruction count is not what holds them back. Read the warps an SM "
                            "holds beside it. Each kernel at its own elements a program "
                            "(runtime/program_sizes.py, in the table): since 2026-11-29 the contiguous decode "
                            "at 2048 (8192 before) and the contiguous quantize of 16-bit "
                            "inputs at 8192 (16384 before), each the size the GPU runs' sweeps found fastest "
                            "where every width stays within budget; the feature-major kernels as before."),
    "static_kernels_block_sizes.json": ("GPU kernels, static: the size of a program",
                                        "`python benchmarks/static_kernels.py --block-sizes 2048 4096 8192 16384`: "
                                        "the quantize and dequantize kernels at 2 and 4 bits, compiled at each size. "
                                        "Smaller programs take fewer registers, so an SM holds more of them, and pay "
                                        "their fixed instructions over fewer elements."),
    "rank_noise.json": ("Data-parallel ranks: one rounding noise for all, or one each",
                        "`python benchmarks/rank_noise.py`: data-parallel ranks simulated in one process, their "
                        "gradients averaged, each rank keyed as a single process (what every rank drew before "
                        "the rank was mixed into the noise's key) against each keyed by its rank (since). "
                        "Independent noise averages to about one rank-th of one rank's error; shared noise "
                        "does not, and its excess grows with the ranks."),
}


def main() -> None:
    target = RESULTS.parent.parent / "BENCHMARKS.md"
    convergences = [load_result(p) for p in sorted(RESULTS.glob("convergence_*.json")) if "." not in p.stem]
    points = tradeoff.run_points(convergences, HIGHER_IS_BETTER)
    plots.loss_against_bytes(tradeoff.curves(points, HIGHER_IS_BETTER), RESULTS / tradeoff.FIGURE)
    write_markdown(RESULTS, target, tables={**TABLE_FILES, **TABLES}, generator="python benchmarks/report.py")
    print(f"wrote {target}")


if __name__ == "__main__":
    main()
