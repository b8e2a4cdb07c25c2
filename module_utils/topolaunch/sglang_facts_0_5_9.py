"""SGLang 0.5.9 facts the planner uses, extracted from sglang-0.5.9-py3-none-any.whl by tools/sglang_facts.py. Do not edit.

Regenerate: tools/sglang_facts.py --all. tools/sglang_facts.py describes every key; each table names the
source function it was read from.
"""

VERSION = (
    '0.5.9'
)

MEMORY = (
    {'source': 'sglang/srt/server_args.py:_handle_gpu_memory_settings',
     'brackets': [{'below_mib': 20480,
                   'chunked_prefill_size': 2048,
                   'cuda_graph_max_bs': 8,
                   'small_tp_below': None,
                   'small_tp_cuda_graph_max_bs': None},
                  {'below_mib': 35840,
                   'chunked_prefill_size': 2048,
                   'cuda_graph_max_bs': 80,
                   'small_tp_below': 4,
                   'small_tp_cuda_graph_max_bs': 24},
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
                 'prefill_graph_mla_mib': None,
                 'graph_reserve_when_disabled': True},
     'speculative_reserve_mib': {'STANDALONE': 6144, '*': 2048, 'except': ['NGRAM']}}
)

CUDA_GRAPH = (
    {'source': 'sglang/srt/server_args.py:_generate_cuda_graph_batch_sizes',
     'max_bs_arg': 'cuda_graph_max_bs',
     'bs_arg': 'cuda_graph_bs',
     'disable_args': ['disable_cuda_graph'],
     'capture_bs': {'explicit': [1, 2, 4, 8, 12],
                    'ranges': [[16, 257, 8], [272, 512, 16], [512, None, 32]],
                    'appends_max_bs': False},
     'backend_arg': None,
     'prefill': {'default_on': False, 'capture_sizes': None, 'disable_args': [], 'backend_arg': None},
     'max_bs_capped_by_max_running_requests': False}
)

RUNNING = (
    {'source': 'sglang/srt/model_executor/model_runner_kv_cache_mixin.py:init_memory_pool',
     'pool_per_context_len': 512,
     'pool_min': 2048,
     'pool_max': 4096,
     'kv_tokens_divisor': 2,
     'server_arg_capped_by_kv_tokens': False,
     'server_arg_divided_by': 'attention_dp_size'}
)

PP = (
    {'source': 'sglang/srt/server_args.py:check_server_args',
     'sets': {'disable_overlap_schedule': True},
     'refuses': ['enable_mixed_chunk', 'speculative_algorithm']}
)

SPARSE_ATTENTION_BACKENDS = (
    ['nsa_decode_backend', 'nsa_prefill_backend']
)

LOADER = (
    {'source': 'sglang/srt/model_loader/loader.py:DefaultModelLoader._get_weights_iterator',
     'arg': 'model_loader_extra_config',
     'switch': 'enable_multithread_load',
     'default_on': False,
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
                                        'flashinfer_cutlass',
                                        'flashinfer_mxfp4',
                                        'flashinfer_cutedsl',
                                        'cutlass']},
     'attention_backend': {'flag': '--attention-backend',
                           'field': 'attention_backend',
                           'default': None,
                           'choices': ['triton',
                                       'torch_native',
                                       'flex_attention',
                                       'nsa',
                                       'cutlass_mla',
                                       'fa3',
                                       'fa4',
                                       'flashinfer',
                                       'flashmla',
                                       'trtllm_mla',
                                       'trtllm_mha',
                                       'dual_chunk_flash_attn',
                                       'aiter',
                                       'wave',
                                       'intel_amx',
                                       'ascend',
                                       'intel_xpu']},
     'fp4_gemm_backend': {'flag': '--fp4-gemm-backend',
                          'field': 'fp4_gemm_runner_backend',
                          'default': 'flashinfer_cutlass',
                          'choices': ['auto', 'flashinfer_cudnn', 'flashinfer_cutlass', 'flashinfer_trtllm']},
     'fp8_gemm_backend': {'flag': '--fp8-gemm-backend',
                          'field': 'fp8_gemm_runner_backend',
                          'default': 'auto',
                          'choices': ['auto',
                                      'deep_gemm',
                                      'flashinfer_trtllm',
                                      'flashinfer_deepgemm',
                                      'cutlass',
                                      'triton',
                                      'aiter']}}
)

SPECULATIVE = (
    {'source': 'sglang/srt/server_args.py:_handle_speculative_decoding',
     'nextn_alias': 'EAGLE',
     'self_draft_architectures': ['DeepseekV32ForCausalLM',
                                  'DeepseekV3ForCausalLM',
                                  'Glm4MoeForCausalLM',
                                  'Glm4MoeLiteForCausalLM',
                                  'GlmMoeDsaForCausalLM',
                                  'BailingMoeForCausalLM',
                                  'BailingMoeV2ForCausalLM',
                                  'BailingMoeV2_5ForCausalLM',
                                  'MistralLarge3ForCausalLM',
                                  'PixtralForConditionalGeneration'],
     'max_running_requests': 48,
     'spec_v2_env': 'SGLANG_ENABLE_SPEC_V2',
     'default_params': [3, 1, 4],
     'pp_algorithms': [],
     'pp_env': None}
)

NUMA = (
    {'source': 'sglang/srt/utils/numa_utils.py:configure_subprocess',
     'bind': 'numactl',
     'args': '--cpunodebind={numa_node} --membind={numa_node}',
     'probe': False,
     'crash_env': None}
)
