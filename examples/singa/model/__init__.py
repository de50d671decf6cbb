"""The example models: cnn, mlp, alexnet, resnet, xceptionnet (each module has create_model)."""
