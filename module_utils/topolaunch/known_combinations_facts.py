"""Facts read from the SGLang wheels by tools/known_combinations.py (the known combinations' claims). Do not edit.

Regenerate: tools/known_combinations.py, which describes every key (None: the release holds no code that
shows it). Wheels: tools/sglang_flags.py's WHEELS (0.5.9, 0.5.23).
"""

FACTS = {
    '0.5.9': {
        'env': {
            'SGLANG_ENABLE_JIT_DEEPGEMM': {'type': 'EnvBool', 'default': True},
            'SGLANG_ENABLE_DEEP_GEMM': None,
            'SGLANG_ENABLE_SPEC_V2': {'type': 'EnvBool', 'default': False},
        },
        'env_bool_words': {'true': ['true', '1', 'yes', 'y'], 'false': ['false', '0', 'no', 'n']},
        'deepgemm_gate': {
            'where': 'sglang/srt/layers/deep_gemm_wrapper/configurer.py:_compute_enable_deep_gemm',
            'reads_env': ['SGLANG_ENABLE_JIT_DEEPGEMM'],
            'sm_checks': ['sm_version < 90'],
        },
        'dsa_kv_cache_default': {
            'where': 'sglang/srt/server_args.py:ServerArgs._set_default_nsa_kv_cache_dtype',
            'sm_major_at_least': 10,
            'then': 'fp8_e4m3',
            'else': 'bfloat16',
        },
        'dsa_attention_backend': {'where': 'sglang/srt/server_args.py', 'value': 'nsa', 'only_when_unset': True},
        'dsa_backends_picked': {
            'where': 'sglang/srt/server_args.py:ServerArgs._set_default_nsa_backends',
            'backends': ['fa3', 'flashmla_auto', 'flashmla_kv', 'flashmla_sparse', 'trtllm'],
        },
        'dsa_flashinfer_kv': None,
    },
    '0.5.23': {
        'env': {
            'SGLANG_ENABLE_JIT_DEEPGEMM': {'type': 'EnvBool', 'default': True},
            'SGLANG_ENABLE_DEEP_GEMM': None,
            'SGLANG_ENABLE_SPEC_V2': None,
        },
        'env_bool_words': {'true': ['true', '1', 'yes', 'y'], 'false': ['false', '0', 'no', 'n']},
        'deepgemm_gate': {
            'where': 'sglang/srt/layers/deep_gemm_wrapper/configurer.py:_compute_enable_deep_gemm',
            'reads_env': ['SGLANG_ENABLE_JIT_DEEPGEMM'],
            'sm_checks': ['sm_version in (120, 121)', 'sm_version < 90', 'sm_version < 31'],
        },
        'dsa_kv_cache_default': {
            'where': 'sglang/srt/arg_groups/overrides.py:_dsa_kv_cache_dtype_default',
            'sm_major_at_least': 10,
            'then': 'fp8_e4m3',
            'else': 'bfloat16',
        },
        'dsa_attention_backend': {
            'where': 'sglang/srt/arg_groups/model_overrides/deepseek_v2.py',
            'value': 'dsa',
            'only_when_unset': True,
        },
        'dsa_backends_picked': {
            'where': 'sglang/srt/arg_groups/overrides.py:_dsa_split_backend_resolution',
            'backends': [
                'fa3',
                'flashinfer_sparse_mla',
                'flashmla_kv',
                'flashmla_sparse',
                'intel_xpu',
                'triton',
                'trtllm',
            ],
        },
        'dsa_flashinfer_kv': {
            'where': 'sglang/kernels/ops/attention/flash_mla_sm120.py:_validate_flashinfer_sparse_mla_backend',
            'backend': 'flashinfer_sparse_mla',
            'kv_cache_dtype': 'torch.float8_e4m3fn',
        },
    },
}
