#!/usr/bin/env bash
# Launch MaxText's own trainer with tpupod's job contract. Nothing here knows tpupod beyond its
# environment: the run's directory is where MaxText writes (its checkpoints land exactly at
# $TPUPOD_CHECKPOINT_DIR), and on CPU (the local pod) MaxText initializes jax.distributed from
# XPK's variables and a fixed port, 1234, so those are derived from the contract's.
set -euo pipefail
hardware=tpu
if [ "${JAX_PLATFORMS:-}" = cpu ]; then
  hardware=cpu
  export JAX_COORDINATOR_ADDRESS="${JAX_COORDINATOR_ADDRESS%:*}" JOB_INDEX=0 PROCESSES_IN_JOB=1 \
    JOB_COMPLETION_INDEX="$TPUPOD_PROCESS_ID" JAX_PROCESS_COUNT="$TPUPOD_NUM_PROCESSES"
fi
config=$(python -c 'import maxtext.configs, os; print(os.path.dirname(maxtext.configs.__file__))')/base.yml
# exec: no shell stays between tpupod and MaxText, so a SIGTERM reaches MaxText itself.
exec python -m maxtext.trainers.pre_train.train "$config" \
  hardware="$hardware" \
  base_output_directory="${TPUPOD_RUN_DIR%/*}" run_name="${TPUPOD_RUN_DIR##*/}" \
  steps=2000 checkpoint_period=100 enable_autocheckpoint=true async_checkpointing=false \
  dataset_type=synthetic enable_data_shuffling=false \
  base_emb_dim=64 base_num_query_heads=2 base_num_kv_heads=2 base_mlp_dim=128 \
  base_num_decoder_layers=2 head_dim=32 vocab_size=256 max_target_length=64 \
  per_device_batch_size=1 dtype=float32 attention=dot_product \
  enable_tensorboard=false enable_goodput_recording=false monitor_goodput=false \
  gcs_metrics=false save_config_to_gcs=false log_period=10
