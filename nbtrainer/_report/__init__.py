"""Numbers, tables and SVG charts, with no dependency beyond the standard library.

===============  ================================================================================
``_format``      every number shown (format_number, format_lr, ...)
``_svg``         svg_chart: dependency-free charts
``_html``        History's report: epoch table, charts, summary
``_decimate``    min/max decimation, smoothing
``_rows``        NamedRows: a result's rows looked up by name (the comparison tables)
``_comparison``  ComparisonTable: the one table type of compare_strategies and compare_inference (text, Markdown,
                 HTML with ratio bars, failed rows with their reason)
===============  ================================================================================
"""
