#!/usr/bin/python
# Copyright: dcu-serving contributors
# Apache License 2.0 (see LICENSE at the collection's root or https://www.apache.org/licenses/LICENSE-2.0)
# SPDX-License-Identifier: Apache-2.0

DOCUMENTATION = r"""
---
module: service_request
short_description: Send one real request of a model service's kind to a vLLM instance, and fail unless it answers
version_added: 0.2.0
description:
  - Sends the request a caller of the service would send - a chat completion (with a small image for a vision
    service), an embedding, a rerank, a transcription of a short silent WAV or a short sentence to speak - to
    O(url), and fails unless the answer proves the model works (a non-empty message, an embedding, a ranking, a
    text, a WAV). C(/health) answering 200 proves only that the server runs.
  - Used on one instance directly, for example the canary of an upgrade before the proxy sends it callers.
  - The request is logged by the instance like any other, under O(orid) as its C(user).
author:
  - dcu-serving contributors (@dcu-serving)
extends_documentation_fragment:
  - dcu.serving.attributes
attributes:
  check_mode:
    support: full
    details: Sends the request in check mode too (it changes nothing on the host).
  diff_mode:
    support: none
seealso:
  - module: dcu.serving.cluster_health
    description: The same requests through the proxy, with every instance's health.
options:
  url:
    description: The instance (or proxy) base URL, as seen from the host, for example V(http://127.0.0.1:8002).
    type: str
    required: true
  kind:
    description: The service's kind, which picks the API.
    type: str
    choices: [chat, vision, embedding, rerank, transcription, speech]
    default: vision
  model:
    description: The served model name to ask for.
    type: str
    required: true
  orid:
    description: The request's C(user), which names it in the logs.
    type: str
    default: dcu-serving-check
  timeout:
    description: Seconds the request may take.
    type: float
    default: 60
"""

EXAMPLES = r"""
- name: Prove vllm@0 answers a real request before the proxy sends it callers again
  dcu.serving.service_request:
    url: http://127.0.0.1:8002
    kind: vision
    model: MiniCPM-V-4.5
    orid: canary-vllm@0
"""

RETURN = r"""
api:
  description: The API the request went to.
  returned: always
  type: str
  sample: chat
status:
  description: The HTTP status, or null when no answer came.
  returned: always
  type: int
  sample: 200
latency_s:
  description: Seconds until the whole answer arrived.
  returned: always
  type: float
  sample: 0.412
"""

import time

from ansible.module_utils.basic import AnsibleModule

from ansible_collections.dcu.serving.plugins.module_utils.service_request import (
    answer_problem,
    send_request,
    server_error,
)


def main():
    module = AnsibleModule(argument_spec=dict(
        url=dict(type="str", required=True),
        kind=dict(type="str", default="vision",
                  choices=["chat", "vision", "embedding", "rerank", "transcription", "speech"]),
        model=dict(type="str", required=True),
        orid=dict(type="str", default="dcu-serving-check"),
        timeout=dict(type="float", default=60),
    ), supports_check_mode=True)
    p = module.params
    started = time.monotonic()
    api, res = send_request(p["url"], p["kind"], p["model"], p["orid"], p["timeout"])
    result = dict(changed=False, api=api, status=res.status, latency_s=round(time.monotonic() - started, 3))
    if res.status is None:
        problem = "no answer (%s)" % res.error
    elif res.status != 200:
        problem = "answered %s (%s)" % (res.status, server_error(res))
    else:
        problem = answer_problem(api, res.body, res.raw)
    if problem:
        module.fail_json(msg="%s request for %s to %s: %s" % (api, p["model"], p["url"], problem), **result)
    module.exit_json(**result)


if __name__ == "__main__":
    main()
