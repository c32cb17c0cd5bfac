mod relay;
