"""What serves browsers and HTTP clients on top of the engine: one engine worker per loaded model that every
session shares (worker), the bounded heavy-job line (jobs) and classroom mode's policy (classroom).
May import: specs, calculators, engine. Never ui, pages or streamlit.
"""
