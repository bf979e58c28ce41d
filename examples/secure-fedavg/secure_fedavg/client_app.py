"""The ClientApp: an ordinary train function, wrapped by fedpriv so that its update leaves the
node only clipped, noised and masked."""

from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict

from fedpriv.flower.secure_strategy import secure_client_app
from secure_fedavg.task import evaluate as evaluate_model
from secure_fedavg.task import model, node_data, train as train_model


def train(msg: Message, context: Context) -> Message:
    net = model()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = node_data(int(context.node_config["partition-id"]))
    cfg = context.run_config
    loss = train_model(net, x, y, int(cfg["local-epochs"]), float(cfg["learning-rate"]))
    return Message(RecordDict({"arrays": ArrayRecord(net.state_dict()), "metrics": MetricRecord({"train-loss": loss})}), reply_to=msg)


def evaluate(msg: Message, context: Context) -> Message:
    net = model()
    net.load_state_dict(msg.content["arrays"].to_torch_state_dict())
    x, y = node_data(int(context.node_config["partition-id"]))
    loss, acc = evaluate_model(net, x, y)
    return Message(RecordDict({"metrics": MetricRecord({"eval-loss": loss, "eval-acc": acc, "num-examples": len(y)})}), reply_to=msg)


app = secure_client_app(train, evaluate)
