import evaluate
from evaluate.utils import launch_gradio_widget


module = evaluate.load("text_generation.py")
launch_gradio_widget(module)
