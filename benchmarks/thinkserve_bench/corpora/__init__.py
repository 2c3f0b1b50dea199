"""Documents generated on the fly, with known content, for the benchmarks and the tests: a three-page report
with a table and a chart and long PDFs (pdf_factory), report-like corpora for ingest (report_corpus), and
one-subject-per-page reports with questions (quality_corpus). They need reportlab (the `bench` extra)."""
