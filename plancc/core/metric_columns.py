"""The metrics table's columns (docs/spec.md §6): name and kind of every value `plancc.planner.metrics.summarize` returns.

Data only, so the store types the table (`store.schemas.metrics_schema`) and the read side lists it without
importing the pipeline's code; `schemas/metrics.arrow.json` documents each column and a test holds the two together.
"""

from __future__ import annotations

METRIC_COLUMNS: tuple[tuple[str, str], ...] = (
    ("samples", "int"),
    ("dropped_samples", "int"),
    ("tail_dropped_samples", "int"),
    ("truncated_samples", "int"),
    ("batches", "int"),
    ("packed_rows", "int"),
    ("mean_packed_length", "float"),
    ("mean_label_count", "float"),
    ("std_label_count", "float"),
    ("label_cv", "float"),
    ("total_label_count", "int"),
    ("total_tokens", "int"),
    ("mean_unpadded_length", "float"),
    ("std_unpadded_length", "float"),
    ("max_unpadded_length", "int"),
    ("mean_batch_cost", "float"),
    ("std_batch_cost", "float"),
    ("max_batch_cost", "int"),
    ("total_batch_cost", "int"),
    ("padding_tokens", "int"),
    ("packing_efficiency", "float"),
    ("rows_lower_bound", "int"),
    ("updates", "int"),
    ("complete_updates", "int"),
    ("mean_global_update_labels", "float"),
    ("std_global_update_labels", "float"),
    ("update_label_cv", "float"),
    ("excluded_tail_microbatches", "int"),
    ("mean_rank_cost_spread", "float"),
    ("max_rank_cost_spread", "int"),
    ("mean_rank_label_spread", "float"),
    ("max_rank_label_spread", "int"),
    ("rank_cost_cv", "float"),
    ("attention_cv", "float"),
    ("mean_rank_attention_spread", "float"),
    ("max_rank_attention_spread", "int"),
    ("rank_attention_cv", "float"),
    ("max_naive_weight_skew", "float"),
)

# preference plans add these (docs/preference.md): pairs per microbatch and per update (the DPO denominator), the
# chosen completions' targets per update (ORPO's NLL denominator); unpaired (KTO) plans the labels per update
KIND_METRIC_COLUMNS: dict[str, tuple[tuple[str, str], ...]] = {
    "sft": (),
    "preference": (
        ("pairs", "int"),
        ("mean_pairs", "float"),
        ("pair_cv", "float"),
        ("mean_global_update_pairs", "float"),
        ("update_pair_cv", "float"),
        ("update_chosen_label_cv", "float"),
    ),
    "unpaired_preference": (
        ("desirable", "int"),
        ("undesirable", "int"),
        ("mean_global_update_desirable", "float"),
        ("update_desirable_cv", "float"),
        ("update_undesirable_cv", "float"),
    ),
}
