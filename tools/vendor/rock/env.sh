# hyhal environment: source /opt/hyhal/env.sh
export HYHAL_PATH=/opt/hyhal
export PATH=/opt/hyhal/bin:${PATH}
export LD_LIBRARY_PATH=/opt/hyhal/lib${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}
