import evaluate
from evaluate.utils import launch_gradio_widget


module = evaluate.load("medihall_detection.py")
launch_gradio_widget(module)
