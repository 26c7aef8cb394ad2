"""Outside the Python API: %nbtrainer magics, the CLI, doctor.

================  ================================================================================
``_magics``       %nbtrainer
``_magics_args``  argument parsing of the magics
``_cli``          nbtrainer / python -m nbtrainer
``_doctor``       environment report
================  ================================================================================
"""
