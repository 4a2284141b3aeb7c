# DTK environment: source /opt/dtk/env.sh. The DTK's own libraries come before the host's hyhal
# (docs/field-evidence.md: the environment of a running DTK 26.04 vLLM process).
export ROCM_PATH=/opt/dtk
export HIP_PATH=/opt/dtk/hip
export DTKROOT=/opt/dtk
export PATH=/opt/dtk/bin:/opt/dtk/hip/bin:/opt/hyhal/bin:${PATH}
export LD_LIBRARY_PATH=/opt/dtk/lib:/opt/dtk/lib64:/opt/dtk/hip/lib:/opt/hyhal/lib:/opt/hyhal/lib64${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
