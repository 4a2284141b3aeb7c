# DTK environment: source /opt/dtk/env.sh
export ROCM_PATH=/opt/dtk
export HIP_PATH=/opt/dtk/hip
export PATH=/opt/dtk/bin:/opt/dtk/hip/bin:${PATH}
export LD_LIBRARY_PATH=/opt/hyhal/lib:/opt/dtk/lib:/opt/dtk/hip/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
