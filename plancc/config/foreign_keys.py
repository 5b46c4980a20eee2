"""Every key of an Axolotl or TRL config, classified by what plancc does with it: the catalogue as data.

A config that compiles must mean "these are the tokens and labels that tool would train on", so each key is one of:

- honoured: plancc reads it into the named setting and gives what the tool gives (the conformance benchmark,
  `benchmarks/bench_axolotl_conformance.py`, measures it against Axolotl's own data pipeline);
- to honour: it shapes the data (which rows, which tokens, which labels, how they are batched) and plancc does not
  reproduce it yet: a config that sets it is refused, naming it and what to do (at a value that changes nothing,
  the tool's default, it is accepted: `AXOLOTL_INERT`);
- training-only: optimizer, schedule, LoRA, precision, logging, hardware, checkpoints: it changes how a model
  trains on the data, never the data; listed in a note, never refused;
- unsupported: data plancc does not plan (preference or reward pairs, streams, multimodal rows, user code): refused
  with what to do.

The key lists are those of Axolotl 0.19.0's config schema (`AxolotlInputConfig`, `SFTDataset`,
`UserDefinedPrompterType` in `axolotl.utils.schemas`) and of TRL 1.16.0's `SFTConfig` (with the
`TrainingArguments` it extends), `ScriptArguments`, `ModelConfig`, `DatasetMixtureConfig`, `DPOConfig` and
`KTOConfig`. Plain data, no logic: the settings registry reads it (docs/axolotl-trl.md is the same table for
people).
"""

AXOLOTL_VERSION = "0.19.0"
TRL_VERSION = "1.16.0"

# Axolotl top-level keys honoured today: key -> the plancc setting it becomes
AXOLOTL_HONOURED = {
    "base_model": "tokenizer (when neither tokenizer_config nor base_model_config is set)",
    "base_model_config": "tokenizer (when tokenizer_config is not set)",
    "tokenizer_config": "tokenizer",
    "sequence_len": "sequence_len",
    "micro_batch_size": "micro_batch_size",
    "gradient_accumulation_steps": "grad_accum",
    "batch_size": "grad_accum = batch_size / micro_batch_size (when gradient_accumulation_steps is not set)",
    "num_epochs": "epochs",
    "seed": "seed",
    "sample_packing": "mode (true: packed, false: padded)",
    "batch_flattening": "mode flattened (without sample_packing)",
    "multipack_real_batches": ("real_batches (unset: Axolotl's default, real batches unless attn_implementation (or "
                               "its legacy flag) packs, e.g. flash_attention_2)"),
    "pad_to_sequence_len": "pad_multiple (the sequence_len rounded up to pad_to_multiple_of, default 64)",
    "pad_to_multiple_of": "pad_multiple (unset: 64 unless pad_to_sequence_len is false)",
    "eval_sample_packing": "eval_mode (unset: as sample_packing)",
    "dataloader_drop_last": "drop_last",
    "dataset_processes": "num_proc",
    "dataset_num_proc": "num_proc",
    "chat_template": "chat_template (chatml, llama3, tokenizer_default, jinja)",
    "chat_template_jinja": "chat_template (a file, or the template's text)",
    "default_system_message": ("nothing: Axolotl 0.19.0 writes it into the tokenizer's saved chatml template only "
                               "(its own chatml template has no default system message to replace)"),
    "datasets": "datasets",
    "test_datasets": "eval_datasets",
    "train_on_inputs": "train_on_inputs (every format; chat: every turn)",
    "special_tokens": "special_tokens (bos/eos/pad/unk_token), added_special_tokens (additional_special_tokens)",
    "tokens": "added_tokens",
    "eot_tokens": "eot_tokens (end_of_turn tokens)",
    "excess_length_strategy": "long (drop, truncate; raise: error)",
    "shuffle_merged_datasets": "nothing: the order of the prepared rows; plancc plans its own seeded order",
    "shuffle_before_merging_datasets": "nothing: the order of the prepared rows; plancc plans its own seeded order",
    "tokenizer_use_fast": "true only (the tokenizer.json); false is refused",
    "tokenizer_type": "AutoTokenizer, PreTrainedTokenizerFast only (the tokenizer.json); others are refused",
    "rl": ("format axolotl_preference (dpo, ipo with type chat_template.default; the loss is the trainer's: "
           "PlanDPOTrainer's loss_type); simpo, orpo, kto and online methods are refused"),
}


# `rl` values honoured: their pairs are rendered by Axolotl's DPO strategy and tokenized by TRL's DPOTrainer
# (docs/preference.md)
AXOLOTL_RL_HONOURED = ("dpo", "ipo")
# `rl` entry types honoured (Axolotl loads `chat_template` as `chat_template.default`)
AXOLOTL_RL_TYPES = ("chat_template", "chat_template.default")
# `rl` values refused: why, and what to do
AXOLOTL_RL_REFUSED = {
    "simpo": ("Axolotl 0.19.0 trains SimPO with TRL's CPOTrainer, which tokenizes the pairs by its own rules (one "
              "bos, its own cut of long pairs), not reproduced yet: compile the pairs as plancc preference data "
              "(docs/preference.md) and train with loss_type simpo"),
    "orpo": ("Axolotl 0.19.0 renders ORPO pairs with its chat_template.argilla strategy and TRL's ORPOTrainer "
             "tokenizes them by its own rules, which plancc does not reproduce yet: compile the pairs as plancc "
             "preference data (docs/preference.md) and train with loss_type orpo"),
    "kto": ("Axolotl 0.19.0's KTO types (chatml.*, llama3.*, user_defined) write each prompt's text themselves and "
            "TRL's KTOTrainer tokenizes it, which plancc does not reproduce yet: compile the rows as plancc "
            "unpaired_preference data (docs/preference.md) and train with loss_type kto"),
    "grpo": "online RL: completions are generated while training, so there is no dataset to plan",
    "gdpo": "online RL: completions are generated while training, so there is no dataset to plan",
    "ebft": "online RL: completions are generated while training, so there is no dataset to plan",
}


# Axolotl top-level keys that shape the data and are not reproduced yet: key -> what they shape
AXOLOTL_TO_HONOUR = {
    "added_tokens_overrides": ("renames added tokens in the tokenizer: give the renamed tokenizer's directory as "
                               "tokenizer_config instead"),
    "chat_template_kwargs": ("variables the chat template renders with: bake them into a template file "
                             "(chat_template_jinja) instead"),
    "role_boundaries": "where each role's turn starts and ends: plancc finds turns from the template's rendering",
    "min_sample_len": "drops rows shorter than it (default 2, as plancc): remove it, or drop them from the files",
    "eval_sequence_len": "the length eval rows are cut to: remove it (eval rows then share sequence_len)",
    "val_set_size": ("holds out the last rows of Axolotl's shuffled merge, which plancc does not reproduce: give "
                     "the held-out rows as test_datasets, or compile a plancc config with val_set_size (plancc's "
                     "own seeded draw)"),
    "curriculum_sampling": "trains in dataset order: plancc plans a seeded order; remove it",
    "dataset_shard_num": "keeps one shard of Axolotl's shuffled rows: give that shard's files instead",
    "dataset_shard_idx": "keeps one shard of Axolotl's shuffled rows: give that shard's files instead",
    "dataset_exact_deduplication": ("drops every prepared row whose tokens and labels repeat an earlier one's: "
                                    "remove the duplicate rows from the files instead"),
    "tokenizer_legacy": "the legacy behaviour of Llama sentencepiece tokenizers: remove it (fast tokenizers only)",
}


# values of keys to honour at which they change nothing (Axolotl's defaults): accepted, like an unset key
AXOLOTL_INERT = {
    "min_sample_len": (1, 2),
    "val_set_size": (0, 0.0),
    "curriculum_sampling": (False,),
    "chat_template_kwargs": ({},),
    "added_tokens_overrides": ({},),
    "dataset_exact_deduplication": (False,),
}


# Axolotl top-level keys of the batch layout, read together (`plancc.config.foreign_axolotl.layout`)
AXOLOTL_LAYOUT_KEYS = ("batch_size", "batch_flattening", "multipack_real_batches", "pad_to_sequence_len",
                       "pad_to_multiple_of", "dataloader_drop_last", "eval_sample_packing")


# Axolotl top-level keys refused: key -> why, and what to do
AXOLOTL_UNSUPPORTED = {
    "reward_model": "a reward model's paired data is not SFT data",
    "process_reward_model": "stepwise reward data is not SFT data",
    "pretraining_dataset": "streamed pretraining data: scan the files as format text instead",
    "streaming": "streamed datasets: plancc scans files; give the files",
    "skip_prepare_dataset": "the data is used as it is: compile it as tokenized data (input_ids, labels)",
    "tokenizer_use_mistral_common": ("mistral-common tokenization has no tokenizer.json; use the model's Hugging Face "
                                     "tokenizer"),
    "trust_remote_code": "plancc never runs a tokenizer's own code",
    "processor_type": "multimodal processors: plancc plans text",
    "use_pose": "PoSE position ids change the data the model sees",
    "pose_split_on_token_ids": "PoSE position ids",
    "pose_max_context_len": "PoSE position ids",
    "pose_num_chunks": "PoSE position ids",
    "pretraining_sample_concatenation": "pretraining streams",
    "pretrain_multipack_attn": "pretraining streams",
    "pretrain_multipack_buffer_size": "pretraining streams",
    "streaming_multipack_buffer_size": "streamed datasets",
    "preprocess_iterable": "streamed preprocessing",
}


# Axolotl top-level keys that never change the data (a note names them)
AXOLOTL_TRAINING_ONLY = (
    "accelerator_config", "activation_offloading", "adam_beta1", "adam_beta2", "adam_beta3", "adam_epsilon",
    "adam_epsilon2", "adapter", "attn_implementation", "auto_find_batch_size", "auto_resume_from_checkpoints",
    "axolotl_config_path", "bench_dataset", "bench_split", "bf16", "bfloat16", "bnb_config_kwargs",
    "center_rewards_coefficient", "chunked_cross_entropy", "chunked_cross_entropy_num_chunks",
    "cls_model_config", "comet_api_key", "comet_experiment_config", "comet_experiment_key", "comet_mode",
    "comet_online", "comet_project_name", "comet_workspace", "context_parallel_size",
    "cosine_constant_lr_ratio", "cosine_min_lr_ratio", "cpo_alpha", "dataloader_num_workers",
    "dataloader_pin_memory", "dataloader_prefetch_factor", "dataset_keep_in_memory", "dataset_prepared_path",
    "ddp", "ddp_broadcast_buffers", "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_timeout",
    "deepcompile", "deepspeed", "device", "device_map", "dion_lr", "dion_momentum", "dion_rank_fraction",
    "dion_rank_multiple_of", "do_bench_eval", "do_causal_lm_eval", "dp_replicate_size", "dp_shard_size",
    "dpo_beta", "dpo_generate_during_eval", "dpo_label_smoothing", "dpo_loss_type", "dpo_loss_weights",
    "dpo_norm_loss", "dpo_padding_free", "dpo_use_liger_kernel", "dpo_use_logits_to_keep", "dpo_use_weighting",
    "dynamic_checkpoint", "eaft_alpha", "eaft_k", "eager_attention", "early_stopping_patience", "ebft",
    "embedding_lr", "embedding_lr_scale", "embeddings_skip_upcast", "eval_batch_size", "eval_causal_lm_metrics",
    "eval_max_new_tokens", "eval_steps", "eval_strategy", "eval_table_size", "evals_per_epoch",
    "evaluation_strategy", "experimental_skip_move_to_device", "experts_implementation", "fix_untrained_tokens",
    "flash_attention", "flash_attn_cross_entropy", "flash_attn_d512", "flash_attn_fuse_mlp",
    "flash_attn_rms_norm", "flash_optimum", "flex_attention", "flex_attn_compile_kwargs", "float16", "float32",
    "fp16", "fp32_norm_classes", "fp32_norms", "fp8", "fp8_config", "fp8_enable_fsdp_float8_all_gather",
    "freeze_mm_modules", "fsdp", "fsdp_config", "fsdp_final_state_dict_type", "fsdp_version",
    "fused_attn_kernel", "gc_collect_steps", "gc_steps", "gemma4_hybrid_attn_impl", "generate_samples",
    "generation_do_sample", "generation_max_new_tokens", "generation_prompt_ratio", "generation_temperature",
    "generation_top_k", "generation_top_p", "gptq", "gpu_memory_limit", "gradient_checkpointing",
    "gradient_checkpointing_kwargs", "gradio_max_new_tokens", "gradio_server_name", "gradio_server_port",
    "gradio_share", "gradio_temperature", "gradio_title", "greater_is_better", "group_by_length",
    "heads_k_stride", "hf_mlflow_log_artifacts", "hf_use_auth_token", "hub_model_id", "hub_revision",
    "hub_strategy", "image_resize_algorithm", "image_size", "include_tkps", "include_tokens_per_second",
    "is_falcon_derived_model", "is_llama_derived_model", "is_mistral_derived_model", "is_preprocess",
    "is_qwen_derived_model", "jagged_restart_anneal_steps", "jagged_restart_steps",
    "jagged_restart_warmup_steps", "kto_desirable_weight", "kto_undesirable_weight", "large_head_attention",
    "layer_offloading", "learning_rate", "lisa_layers_attribute", "lisa_n_layers", "lisa_step_interval",
    "llama4_linearized_experts", "load_best_model_at_end", "load_in_4bit", "load_in_8bit", "local_rank",
    "logging_steps", "lora_alpha", "lora_alpha_pattern", "lora_dropout", "lora_embedding_kernel",
    "lora_fan_in_fan_out", "lora_mlp_kernel", "lora_model_dir", "lora_modules_to_save", "lora_o_kernel",
    "lora_on_cpu", "lora_qkv_kernel", "lora_r", "lora_rank_pattern", "lora_target_linear",
    "lora_target_modules", "lora_target_parameters", "loraplus_lr_embedding", "loraplus_lr_ratio",
    "loss_watchdog_patience", "loss_watchdog_threshold", "low_cpu_mem_usage", "lr_div_factor", "lr_groups",
    "lr_quadratic_warmup", "lr_scheduler", "lr_scheduler_kwargs", "max_grad_norm", "max_memory",
    "max_packed_sequence_len", "max_prompt_len", "max_steps", "mean_resizing_embeddings", "merge_lora",
    "merge_method", "metric_for_best_model", "mlflow_experiment_name", "mlflow_run_name", "mlflow_tracking_uri",
    "model_quantization_config", "model_quantization_config_kwargs", "neftune_noise_alpha",
    "noisy_embedding_alpha", "num_dataset_shards_to_save", "num_generation_samples", "num_labels", "optim_args",
    "optim_target_modules", "optimizer", "orpo_alpha", "otel_metrics_host", "otel_metrics_port", "output_dir",
    "overrides_of_model_config", "overrides_of_model_kwargs", "peft", "peft_autocast_adapter_dtype",
    "peft_ensure_weight_tying", "peft_init_lora_weights", "peft_layer_replication", "peft_layers_pattern",
    "peft_layers_to_transform", "peft_trainable_token_indices", "peft_use_dora", "peft_use_rslora",
    "ple_cpu_offload", "plugins", "precompute_ref_log_probs", "processor_kwargs", "profiler_steps",
    "profiler_steps_start", "push_dataset_to_hub", "qat", "qgalore_cos_threshold", "qgalore_gamma_proj",
    "qgalore_proj_bits", "qgalore_proj_group_size", "qgalore_proj_quant", "qgalore_proj_type",
    "qgalore_queue_size", "qgalore_rank", "qgalore_scale", "qgalore_update_proj_gap",
    "qlora_sharded_model_loading", "quantization", "quantize_moe_experts", "ray_num_workers", "ray_run_name",
    "reinit_weights", "relora", "relora_cpu_offload", "relora_prune_method", "relora_prune_ratio",
    "remove_unused_columns", "resize_token_embeddings_to_32x", "resources_per_worker", "resume_from_checkpoint",
    "revision_of_model", "ring_attn_func", "rl_beta", "rope_scaling", "rpo_alpha", "s2_attention",
    "sage_attention", "sample_packing_bin_size", "sample_packing_eff_est", "sample_packing_group_size",
    "sample_packing_mp_start_method", "sample_packing_sequentially", "save_first_step", "save_only_model",
    "save_safetensors", "save_steps", "save_strategy", "save_total_limit", "saves_per_epoch", "scaling_softmax",
    "scaling_softmax_bias", "scaling_softmax_factor", "sdp_attention", "sdpa_varlen", "selective_checkpointing",
    "sequence_parallel_degree", "shrink_embeddings", "simpo_gamma", "strict", "tensor_parallel_size", "tf32",
    "tiled_mlp", "tiled_mlp_num_shards", "tiled_mlp_use_original_mlp", "tokenizer_save_jinja_files",
    "torch_compile", "torch_compile_backend", "torch_compile_mode", "torch_compile_options",
    "torch_empty_cache_steps", "torchdistx_path", "total_num_tokens", "total_supervised_tokens",
    "trackio_project_name", "trackio_run_name", "trackio_space_id", "trainer_cls", "trl", "type_of_model",
    "unfrozen_parameters", "use_comet", "use_eaft", "use_kernels", "use_mlflow", "use_onebitllms",
    "use_otel_metrics", "use_ray", "use_tensorboard", "use_trackio", "use_wandb", "vllm", "wandb_entity",
    "wandb_log_model", "wandb_mode", "wandb_name", "wandb_project", "wandb_run_id", "wandb_watch",
    "warmup_ratio", "world_size", "warmup_steps", "weight_decay", "xformers_attention",
)


# keys of an Axolotl `datasets` / `test_datasets` entry honoured today
AXOLOTL_DATASET_HONOURED = {
    "path": "path",
    "data_files": "path",
    "split": "split",
    "type": "format (alpaca, chat_template, completion, input_output, a mapping)",
    "field_messages": "columns messages=FIELD (default messages: a source without it is an error)",
    "message_property_mappings": "message_fields role, content (each required in every message)",
    "message_field_role": "message_fields role",
    "message_field_content": "message_fields content",
    "message_field_training": "message_fields training (the per-turn flag)",
    "field": "columns text=FIELD (type completion)",
    "ds_type": "the file type (plancc reads it from the file's suffix)",
    "roles": "roles (source names onto roles; unset: Axolotl's human, user, gpt, assistant, system, tool)",
    "roles_to_train": "roles_to_train (source names mapped by roles)",
    "train_on_eos": "train_on_eos (end_of_turn tokens)",
    "train_on_eot": "train_on_eot (end_of_turn tokens)",
    "drop_system_message": "drop_system_message (a leading system turn)",
    "chat_template": "this dataset's chat_template",
    "chat_template_jinja": "this dataset's chat_template (a file, or the template's text)",
    "split_thinking": "split_thinking",
    "field_thinking": "nothing: Axolotl 0.19.0 reads reasoning from the message key the template reads",
    "template_thinking_key": "thinking_key (where split_thinking puts the reasoning)",
    "preprocess_shards": "nothing: preprocessing in shards does not change the rows",
    "input_format": "nothing: Axolotl 0.19.0 reads it nowhere (its schema has it)",
    "field_chosen": "columns chosen=FIELD (with rl; refused without it: preference pairs are not SFT data)",
    "field_rejected": "columns rejected=FIELD (with rl; refused without it)",
}


# keys of an entry that shape the data and are not reproduced yet
AXOLOTL_DATASET_TO_HONOUR = {
    "message_field_training_detail": ("per-turn character spans trained: split the turns, or flag whole turns with "
                                      "message_field_training"),
    "field_tools": "the row field holding tools the template renders: remove it (plancc renders no tools)",
    "field_human": "legacy ShareGPT role names: use roles",
    "field_model": "legacy ShareGPT role names: use roles",
    "shards": "one shard of Axolotl's shuffled rows: give that shard's files instead",
    "shards_idx": "one shard of Axolotl's shuffled rows: give that shard's files instead",
    "revision": "a Hub dataset's revision: give the files of that revision",
    "name": "a Hub dataset's configuration: give that configuration's files as path",
}


# keys of an entry refused: why, and what to do
AXOLOTL_DATASET_UNSUPPORTED = {
    "conversation": "legacy FastChat conversation styles: use type chat_template",
    "input_transform": "a Python transform of each row: plancc runs no user code; transform the files first",
    "logprobs_field": "distillation targets are not token labels",
    "temperature": "distillation targets are not token labels",
    "trust_remote_code": "plancc never runs a dataset's own code",
}


# keys of an entry's `type` given as a mapping (a user-defined Alpaca-like prompt) honoured today
AXOLOTL_TYPE_MAPPING_HONOURED = {
    "field_instruction": "columns instruction=FIELD",
    "field_input": "columns input=FIELD",
    "field_output": "columns output=FIELD",
    "format": "prompt_format",
    "no_input_format": "no_input_format",
}


# keys of such a mapping not reproduced yet
AXOLOTL_TYPE_MAPPING_TO_HONOUR = {
    "field_system": "the row field holding a system prompt",
    "system_format": "how the system prompt is rendered",
    "system_prompt": "the system prompt of every row",
}


# entry `type` values honoured today
AXOLOTL_TYPES_HONOURED = (
    "alpaca", "chat_template", "completion", "input_output",
)


# entry `type` values of SFT prompt strategies not reproduced yet (refused until they are)
AXOLOTL_TYPES_TO_HONOUR = (
    "alpaca_chat", "alpaca_w_system", "alpaca_instruct", "context_qa", "pretrain", "user_defined",
)


# entry `type` values refused: why, and what to do (any other value is refused too)
AXOLOTL_TYPES_UNSUPPORTED = {
    "sharegpt": ("removed in Axolotl; use type chat_template with field_messages: conversations and "
                 "message_property_mappings {role: from, content: value}"),
    "bradley_terry": "reward-model pairs: not SFT data",
    "stepwise_supervised": "stepwise reward data: not SFT data",
    "messages": "use type chat_template",
    "_synthetic": "synthetic rows",
}


# TRL SFT config keys (SFTConfig, ScriptArguments, ModelConfig) honoured today
TRL_HONOURED = {
    "tokenizer_name_or_path": "tokenizer",
    "model_name_or_path": "tokenizer (when tokenizer_name_or_path is not set)",
    "max_length": "sequence_len",
    "max_seq_length": "sequence_len (older TRL spelling of max_length)",
    "completion_only_loss": ("train_on_inputs = not completion_only_loss (false: a prompt is trained too, of a "
                             "conversational prompt/completion every token; refused with assistant_only_loss true)"),
    "assistant_only_loss": ("true: roles_to_train assistant; false or unset: train_on all_tokens (TRL's loss on "
                            "conversational data: every token, role markup too)"),
    "per_device_train_batch_size": "micro_batch_size",
    "gradient_accumulation_steps": "grad_accum",
    "num_train_epochs": "epochs (a whole number)",
    "seed": "seed",
    "dataset_num_proc": "num_proc",
    "chat_template_path": "chat_template",
    "dataset_name": "datasets (one dataset)",
    "dataset_train_split": "split",
    "dataset_text_field": "columns text=FIELD",
    "packing": "mode (true: packed, false: padded)",
}


# TRL SFT config keys that shape the data and are not reproduced yet
TRL_TO_HONOUR = {
    "eos_token": "the eos appended and trained",
    "pad_token": "the pad token (no label; named so the trainer pads alike)",
    "padding_free": "samples concatenated without padding (plancc: mode flattened or packed rows)",
    "pad_to_multiple_of": "rows padded to a multiple (plancc: pad_multiple)",
    "truncation_mode": "which end of an over-long row is cut (plancc drops by default)",
    "packing_strategy": "bfd or wrapped: wrapped cuts samples across rows",
    "eval_packing": "the eval plan packed or not",
    "shuffle_dataset": "the dataset shuffled before training",
    "dataset_kwargs": "skip_prepare_dataset and other preparation switches",
    "dataset_test_split": "the eval split",
    "dataset_config": "the Hub dataset's configuration",
    "dataloader_drop_last": "the last incomplete update dropped (plancc: drop_last)",
    "data_seed": "the sampler's seed (plancc: seed)",
    "model_revision": "the tokenizer's revision",
    "datasets": "TRL's dataset mixture: each entry a recipe dataset",
    "test_split_size": "the share of a mixture held out for evaluation",
}


# values of TRL keys to honour at which they change nothing (its defaults): accepted
TRL_INERT = {
    "truncation_mode": ("keep_start",),
    "packing_strategy": ("bfd",),
    "shuffle_dataset": (False,),
}


# TRL config keys refused: why, and what to do
TRL_UNSUPPORTED = {
    "dataset_streaming": "streamed datasets: plancc scans files; give the files",
    "trust_remote_code": "plancc never runs a tokenizer's own code",
    "streaming": "streamed datasets",
}


# TRL keys of the batch layout, read together (`plancc.config.foreign_trl`)
TRL_LAYOUT_KEYS = ()


# TRL SFT config keys that never change the data (TrainingArguments' optimizer, logging, hardware, ...;
# ModelConfig's LoRA and quantization)
TRL_TRAINING_ONLY = (
    "accelerator_config", "activation_checkpointing", "activation_checkpointing_kwargs",
    "activation_offloading", "adam_beta1", "adam_beta2", "adam_epsilon", "attn_implementation",
    "auto_find_batch_size", "average_tokens_across_devices", "batch_eval_metrics", "bf16", "bf16_full_eval",
    "bnb_4bit_quant_storage", "bnb_4bit_quant_type", "dataloader_in_order",
    "dataloader_multiprocessing_context", "dataloader_num_workers", "dataloader_persistent_workers",
    "dataloader_pin_memory", "dataloader_prefetch_factor", "ddp_backend", "ddp_broadcast_buffers",
    "ddp_bucket_cap_mb", "ddp_find_unused_parameters", "ddp_static_graph", "ddp_timeout", "debug", "deepspeed",
    "disable_tqdm", "do_eval", "do_predict", "do_train", "dtype", "enable_jit_checkpoint",
    "eval_accumulation_steps", "eval_delay", "eval_do_concat_batches", "eval_on_start", "eval_steps",
    "eval_strategy", "eval_use_gather_object", "fp16", "fp16_full_eval", "fsdp", "fsdp_config",
    "full_determinism", "gradient_checkpointing", "gradient_checkpointing_kwargs", "greater_is_better",
    "hub_always_push", "hub_model_id", "hub_private_repo", "hub_revision", "hub_strategy", "hub_token",
    "ignore_bias_buffers", "ignore_data_skip", "include_for_metrics", "include_num_input_tokens_seen",
    "label_names", "label_smoothing_factor", "learning_rate", "length_column_name", "liger_kernel_config",
    "load_best_model_at_end", "load_in_4bit", "load_in_8bit", "local_rank", "log_level", "log_level_replica",
    "log_on_each_node", "logging_first_step", "logging_nan_inf_filter", "logging_steps", "logging_strategy",
    "lora_alpha", "lora_dropout", "lora_modules_to_save", "lora_r", "lora_target_modules",
    "lora_target_parameters", "lora_task_type", "loss_type", "lr_scheduler_kwargs", "lr_scheduler_type",
    "max_grad_norm", "max_steps", "metric_for_best_model", "model_init_kwargs", "neftune_noise_alpha", "optim",
    "optim_args", "optim_target_modules", "output_dir", "parallelism_config", "per_device_eval_batch_size",
    "prediction_loss_only", "project", "push_to_hub", "remove_unused_columns", "report_to",
    "restore_callback_states_from_checkpoint", "resume_from_checkpoint", "router_aux_loss_coef", "run_name",
    "save_on_each_node", "save_only_model", "save_steps", "save_strategy", "save_total_limit",
    "skip_memory_metrics", "tf32", "torch_compile", "torch_compile_backend", "torch_compile_mode",
    "torch_empty_cache_steps", "trackio_bucket_id", "trackio_space_id", "trackio_static_space_id",
    "train_sampling_strategy", "use_bnb_nested_quant", "use_cache", "use_cpu", "use_dora", "use_liger_kernel",
    "use_peft", "use_rslora", "warmup_steps", "weight_decay",
)


# keys DPOConfig or KTOConfig has and SFTConfig has not: a config holding one trains on preference or unpaired-
# feedback data (docs/preference.md); they set the loss, not the data, and are named in the note
TRL_PREFERENCE_ONLY = (
    "beta", "desirable_weight", "disable_dropout", "discopop_tau", "f_alpha_divergence_coef",
    "f_divergence_type", "label_smoothing", "ld_alpha", "loss_weights", "precompute_ref_batch_size",
    "precompute_ref_log_probs", "ref_model_mixup_alpha", "ref_model_sync_steps", "sync_ref_model",
    "undesirable_weight", "use_weighting",
)

# the ones only KTOConfig has: a config holding one trains on unpaired feedback (format unpaired_preference)
TRL_KTO_ONLY = ("desirable_weight", "undesirable_weight")
# the ones DPOConfig and KTOConfig both have: which of the two trainers, the data tells
TRL_DPO_AND_KTO = ("beta", "disable_dropout", "precompute_ref_batch_size", "precompute_ref_log_probs",
                   "ref_model_mixup_alpha", "ref_model_sync_steps", "sync_ref_model")
