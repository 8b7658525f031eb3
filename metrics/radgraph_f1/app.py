import evaluate
from evaluate.utils import launch_gradio_widget


module = evaluate.load("radgraph_f1.py")
launch_gradio_widget(module)
