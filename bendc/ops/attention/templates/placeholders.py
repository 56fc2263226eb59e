"""The values the templates' PARALLEL, SCALE, CAUSAL and FUSED stand for, so that the template files
import and lint; bendc/ops/attention/cpu.py replaces each name by the call site's value."""
PARALLEL = False
SCALE = 1.0
CAUSAL = False
FUSED = False
