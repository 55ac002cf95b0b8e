"""API accuracy pre-check: replay each recorded API on a high-precision bench and grade its recorded output.

Modules by job: ``api_classes`` (which standard an API is graded by), ``standards`` (the grading rules, numpy
only), ``api_resolver`` (an msprobe call name back to a torch function, rows back to arguments), ``rows``
(the calls table's API rows as plain records), ``generated_inputs`` (inputs for a statistics dump),
``references`` (reference implementations of fused ops), ``replay`` (one call run again on the bench),
``result`` (``AccCheckResult``, torch-free), ``acc_check`` (the driver), ``compare_prechecks`` (two
pre-checks side by side) and ``online`` (the pre-check while a run goes). See docs/precheck.md.
"""
