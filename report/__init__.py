"""The weekly report: figures from the store's history, recommendations, rendering."""
