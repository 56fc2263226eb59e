"""The values the templates' PARALLEL, SCALE and CAUSAL stand for, so that the template files
import and lint; bendc/ops/attention/cpu.py replaces each name by the call site's value."""
PARALLEL = False
SCALE = 1.0
CAUSAL = False
