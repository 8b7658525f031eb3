import evaluate
from evaluate.utils import launch_gradio_widget


module = evaluate.load("sh_judge.py")
launch_gradio_widget(module)
