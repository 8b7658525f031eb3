import evaluate
from evaluate.utils import launch_gradio_widget


module = evaluate.load("close_ended_accuracy.py")
launch_gradio_widget(module)
