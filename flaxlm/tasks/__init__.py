"""Fine-tuning tasks: sentence prediction (classification, regression) and extractive question answering."""
