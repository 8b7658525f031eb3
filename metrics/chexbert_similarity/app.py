import evaluate
from evaluate.utils import launch_gradio_widget


module = evaluate.load("chexbert_similarity.py")
launch_gradio_widget(module)
