#!/usr/bin/python
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: model_info
short_description: What a model directory says about the model's size in VRAM
version_added: 0.1.0
description:
  - Reads C(config.json) in a model directory on the managed host and returns the numbers a VRAM budget and
    the tensor parallel check need - layers, attention heads, KV heads, head size, hidden size, dtype, context
    length, architectures and quantization.
  - Multimodal configs are understood - the language model's numbers come from C(text_config), C(llm_config),
    C(language_config) or C(thinker_config.text_config) when the config has one, else from the top level
    (MiniCPM-V keeps them there next to C(vision_config), which is never read). Encoder-decoder models
    (Whisper) report their decoder.
  - Lists the weight files vLLM would load with their sizes and the sum, taken from the file system only (the
    files are never opened) - C(*.safetensors), else C(*.bin), else C(*.pt); only the files an index
    (C(model.safetensors.index.json)) maps, and not another precision variant of the same weights. Files it
    would skip are listed apart with the reason.
  - Says whether tokenizer files are present.
  - Fails, naming the path and the fix, when the directory or its C(config.json) is missing or
    C(config.json) is not a JSON object. Never changes anything.
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details: Read-only; runs the same in check mode.
  diff_mode:
    support: none
seealso:
  - module: dcu.serving.dcu_facts
    description: The cards and their VRAM the budget compares against.
options:
  path:
    description: The model directory on the managed host (the one C(vllm serve) is given).
    type: path
    required: true
notes:
  - Values a config does not state are returned as null and named in RV(missing); C(num_key_value_heads)
    defaults to C(num_attention_heads) and C(head_dim) to C(hidden_size / num_attention_heads), as in
    transformers.
"""

EXAMPLES = r"""
- name: Read each service's model directory
  dcu.serving.model_info:
    path: "{{ item }}"
  loop: "{{ dcu_vllm_services | map(attribute='model_dir') | unique }}"
  register: __models

- name: The model's weights in GiB
  ansible.builtin.debug:
    msg: "{{ (__models.results[0].weights_bytes / 1073741824) | round(1) }} GiB"
"""

RETURN = r"""
path:
  description: The model directory.
  returned: always
  type: str
  sample: /models/Qwen2.5-14B-Instruct
config_file:
  description: The C(config.json) read.
  returned: always
  type: str
architectures:
  description: The model's architectures from C(config.json).
  returned: always
  type: list
  elements: str
  sample: [Qwen2ForCausalLM]
model_type:
  description: The top-level C(model_type).
  returned: always
  type: str
  sample: qwen2
text_config_key:
  description: The sub-config the language model's numbers came from; null when they sit at the top level.
  returned: always
  type: str
  sample: llm_config
text_model_type:
  description: The language model's C(model_type).
  returned: always
  type: str
num_hidden_layers:
  description: Layers of the language model (the decoder's for an encoder-decoder model).
  returned: always
  type: int
  sample: 48
num_attention_heads:
  description: Attention heads; tensor parallel must divide it.
  returned: always
  type: int
  sample: 40
num_key_value_heads:
  description: KV heads (C(num_attention_heads) when the config has none).
  returned: always
  type: int
  sample: 8
head_dim:
  description: Size of one head (C(hidden_size / num_attention_heads) when the config has none).
  returned: always
  type: int
  sample: 128
hidden_size:
  description: Hidden size.
  returned: always
  type: int
  sample: 5120
torch_dtype:
  description: The dtype the weights are stored in (C(torch_dtype), or C(dtype) in newer configs).
  returned: always
  type: str
  sample: bfloat16
max_position_embeddings:
  description: The longest context the model supports (C(max_target_positions) for Whisper).
  returned: always
  type: int
  sample: 32768
max_model_len_limit:
  description:
    - The longest C(--max-model-len) vLLM accepts for the model - RV(max_position_embeddings), times the RoPE
      scaling factor where vLLM applies it (C(yarn) from C(original_max_position_embeddings)).
  returned: always
  type: int
  sample: 131072
kv_lora_rank:
  description: MLA models (DeepSeek V2/V3) only; their KV cache is one latent per layer.
  returned: always
  type: int
qk_rope_head_dim:
  description: MLA models only.
  returned: always
  type: int
is_encoder_decoder:
  description: Whether the model is an encoder-decoder (Whisper).
  returned: always
  type: bool
encoder_only:
  description: Whether the model is an encoder-only model (BERT, XLM-RoBERTa), which keeps no KV cache.
  returned: always
  type: bool
encoder_positions:
  description: Encoder positions of an encoder-decoder model (C(max_source_positions), 1500 for Whisper).
  returned: always
  type: int
quantization_config:
  description: C(quantization_config) as the config states it; null when unquantized.
  returned: always
  type: dict
quantization:
  description: Its C(quant_method), for example C(awq) or C(gptq).
  returned: always
  type: str
missing:
  description: Numbers the config does not state (the budget cannot use them).
  returned: always
  type: list
  elements: str
weight_format:
  description: The format vLLM would load - C(safetensors), C(bin) or C(pt); null when there are no weights.
  returned: always
  type: str
weight_files:
  description: The weight files vLLM would load, each with its C(name) and C(size) in bytes.
  returned: always
  type: list
  elements: dict
  sample: [{name: model-00001-of-00008.safetensors, size: 3892000000}]
weights_bytes:
  description: The sum of the sizes of RV(weight_files).
  returned: always
  type: int
  sample: 29540067328
ignored_files:
  description: Weight-like files vLLM would not load, each with C(name), C(size) and C(reason).
  returned: always
  type: list
  elements: dict
tokenizer:
  description: Whether any tokenizer file is present.
  returned: always
  type: bool
tokenizer_files:
  description: The tokenizer files present.
  returned: always
  type: list
  elements: str
  sample: [tokenizer.json, tokenizer_config.json, vocab.json, merges.txt]
"""

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils.model_config import ModelInfoError, read_model_info


def main():
    module = AnsibleModule(
        argument_spec=dict(path=dict(type="path", required=True)),
        supports_check_mode=True,
    )
    path = module.params["path"].rstrip("/") or "/"
    try:
        info = read_model_info(path)
    except ModelInfoError as error:
        module.fail_json(msg="model_info: {}".format(error), path=path)
    module.exit_json(changed=False, **info)


if __name__ == "__main__":
    main()
