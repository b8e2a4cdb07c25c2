"""SGLang 0.5.23 facts the planner uses, extracted from sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl by tools/sglang_facts.py. Do not edit.

Regenerate: tools/sglang_facts.py --all. tools/sglang_facts.py describes every key; each table names the
source function it was read from.
"""

VERSION = (
    '0.5.23'
)

MEMORY = (
    {'source': 'sglang/srt/arg_groups/memory_hook.py:handle_gpu_memory_settings',
     'brackets': [{'below_mib': 20480,
                   'chunked_prefill_size': 2048,
                   'cuda_graph_max_bs': 8,
                   'small_tp_below': None,
                   'small_tp_cuda_graph_max_bs': None},
                  {'below_mib': 35840,
                   'chunked_prefill_size': 4096,
                   'cuda_graph_max_bs': 160,
                   'small_tp_below': 4,
                   'small_tp_cuda_graph_max_bs': 48},
                  {'below_mib': 61440,
                   'chunked_prefill_size': 4096,
                   'cuda_graph_max_bs': 160,
                   'small_tp_below': 4,
                   'small_tp_cuda_graph_max_bs': 32},
                  {'below_mib': 92160,
                   'chunked_prefill_size': 8192,
                   'cuda_graph_max_bs': 512,
                   'small_tp_below': 4,
                   'small_tp_cuda_graph_max_bs': 256},
                  {'below_mib': 163840,
                   'chunked_prefill_size': 8192,
                   'cuda_graph_max_bs': 512,
                   'small_tp_below': 4,
                   'small_tp_cuda_graph_max_bs': 256},
                  {'below_mib': None,
                   'chunked_prefill_size': 16384,
                   'cuda_graph_max_bs': 512,
                   'small_tp_below': None,
                   'small_tp_cuda_graph_max_bs': None}],
     'reserve': {'base_mib': 512,
                 'activation_min_tokens': 2048,
                 'activation_mib_per_token': 1.5,
                 'graph_mib_per_bs': 2,
                 'parallel_mib_per_gpu': 128.0,
                 'floor_mib': 10240,
                 'floor_above_mib': 61440,
                 'prefill_graph_mib_per_size': 8,
                 'prefill_graph_mla_mib': 1536.0,
                 'graph_reserve_when_disabled': False},
     'speculative_reserve_mib': {}}
)

CUDA_GRAPH = (
    {'source': 'sglang/srt/arg_groups/cuda_graph_hook.py:generate_decode_cuda_graph_batch_sizes',
     'max_bs_arg': 'cuda_graph_max_bs_decode',
     'bs_arg': 'cuda_graph_bs_decode',
     'disable_args': ['disable_cuda_graph', 'disable_decode_cuda_graph'],
     'capture_bs': {'explicit': [1, 2, 4, 8, 12],
                    'ranges': [[16, 257, 8], [272, 512, 16], [512, None, 32]],
                    'appends_max_bs': True},
     'backend_arg': 'cuda_graph_backend_decode',
     'prefill': {'default_on': True,
                 'capture_sizes': {'explicit': [],
                                   'ranges': [[4, 33, 4],
                                              [48, 257, 16],
                                              [288, 513, 32],
                                              [576, 1025, 64],
                                              [1280, 4097, 256],
                                              [4608, None, 512]]},
                 'disable_args': ['disable_cuda_graph', 'disable_prefill_cuda_graph'],
                 'backend_arg': 'cuda_graph_backend_prefill'},
     'max_bs_capped_by_max_running_requests': True}
)

RUNNING = (
    {'source': 'sglang/srt/mem_cache/kv_cache_configurator.py:resolve_max_num_reqs',
     'pool_per_context_len': 512,
     'pool_min': 2048,
     'pool_max': 4096,
     'kv_tokens_divisor': 2,
     'server_arg_capped_by_kv_tokens': True,
     'server_arg_divided_by': 'attention_dp_size'}
)

PP = (
    {'source': 'sglang/srt/arg_groups/validation_hook.py:check_pipeline_parallel_compat',
     'sets': {'disable_overlap_schedule': True, 'cuda_graph_backend_prefill': 'disabled'},
     'refuses': ['enable_multi_layer_eagle', 'min_free_slots_delay', 'speculative_algorithm']}
)

SPARSE_ATTENTION_BACKENDS = (
    ['dsa_decode_backend', 'dsa_prefill_backend']
)

LOADER = (
    {'source': 'sglang/srt/model_loader/loader.py:DefaultModelLoader._get_weights_iterator',
     'arg': 'model_loader_extra_config',
     'switch': 'enable_multithread_load',
     'default_on': True,
     'threads_key': 'num_threads',
     'default_threads': 8,
     'allowed_keys': ['enable_multithread_load', 'num_threads']}
)

BACKENDS = (
    {'moe_runner_backend': {'flag': '--moe-runner-backend',
                            'field': 'moe_runner_backend',
                            'default': 'auto',
                            'choices': ['auto',
                                        'deep_gemm',
                                        'triton',
                                        'triton_kernel',
                                        'flashinfer_trtllm',
                                        'experimental_sgl_trtllm',
                                        'flashinfer_trtllm_routed',
                                        'flashinfer_cutlass',
                                        'flashinfer_mxfp4',
                                        'flashinfer_cutedsl',
                                        'flashinfer_megamoe',
                                        'cutlass',
                                        'aiter',
                                        'marlin',
                                        'humming',
                                        'experimental_sgl_marlin',
                                        'lora_cutedsl',
                                        'lora_triton',
                                        'lora_marlin',
                                        'hpc_ops',
                                        'megamoe',
                                        'intel_xpu']},
     'attention_backend': {'flag': '--attention-backend',
                           'field': 'attention_backend',
                           'default': None,
                           'choices': ['triton',
                                       'torch_native',
                                       'flex_attention',
                                       'dsa',
                                       'nsa',
                                       'qsa',
                                       'dsv4',
                                       'compressed',
                                       'fa3',
                                       'fa4',
                                       'flashinfer',
                                       'llada2_cfg_flashinfer',
                                       'flashmla',
                                       'trtllm_mla',
                                       'cutedsl_mla',
                                       'tokenspeed_mla',
                                       'trtllm_mha',
                                       'hpc_ops',
                                       'minicpm_flashattn',
                                       'minicpm_flashinfer',
                                       'aiter',
                                       'wave',
                                       'intel_amx',
                                       'ascend',
                                       'intel_xpu']},
     'fp4_gemm_backend': {'flag': '--fp4-gemm-backend',
                          'field': 'fp4_gemm_runner_backend',
                          'default': 'auto',
                          'choices': ['auto',
                                      'flashinfer_cudnn',
                                      'flashinfer_cutedsl',
                                      'flashinfer_cutlass',
                                      'flashinfer_trtllm',
                                      'marlin']},
     'fp8_gemm_backend': {'flag': '--fp8-gemm-backend',
                          'field': 'fp8_gemm_runner_backend',
                          'default': 'auto',
                          'choices': ['auto',
                                      'deep_gemm',
                                      'flashinfer_trtllm',
                                      'flashinfer_cutlass',
                                      'flashinfer_deepgemm',
                                      'flashinfer_cutedsl',
                                      'cutlass',
                                      'triton',
                                      'aiter']}}
)

SPECULATIVE = (
    {'source': 'sglang/srt/arg_groups/speculative_hook.py:_handle_eagle_family',
     'nextn_alias': 'EAGLE',
     'self_draft_architectures': ['DeepseekV32ForCausalLM',
                                  'DeepseekV3ForCausalLM',
                                  'DeepseekV4ForCausalLM',
                                  'Glm4MoeForCausalLM',
                                  'Glm4MoeLiteForCausalLM',
                                  'GlmMoeDsaForCausalLM',
                                  'BailingMoeForCausalLM',
                                  'BailingMoeV2ForCausalLM',
                                  'BailingMoeV2_5ForCausalLM',
                                  'MistralLarge3ForCausalLM',
                                  'PixtralForConditionalGeneration',
                                  'HYV3ForCausalLM',
                                  'HYV4ForCausalLM',
                                  'Qwen4ExpForConditionalGeneration'],
     'max_running_requests': 48,
     'spec_v2_env': None,
     'default_params': [3, 1, 4],
     'pp_algorithms': ['EAGLE'],
     'pp_env': 'SGLANG_ENABLE_PP_SPEC'}
)

NUMA = (
    {'source': 'sglang/srt/utils/numa_utils.py:configure_subprocess',
     'bind': 'numactl',
     'args': '--cpunodebind={node} --membind={node}',
     'probe': True,
     'crash_env': 'SGLANG_CRASH_ON_NUMA_BIND_FAILURE'}
)
