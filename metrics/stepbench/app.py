import evaluate
from evaluate.utils import launch_gradio_widget


module = evaluate.load("stepbench.py")
launch_gradio_widget(module)
