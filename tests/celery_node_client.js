// A real celery-node producer: sends tandem.infer with the protocol given, prints the result.
// Usage: node celery_node_client.js REDIS_URL PROTOCOL QUEUE MODEL INPUTS_JSON
const celery = require("celery-node");

const [url, protocol, queue, model, inputs] = process.argv.slice(2);
const client = celery.createClient(url, url, queue);
client.conf.TASK_PROTOCOL = Number(protocol);
const result = client.createTask("tandem.infer").applyAsync([], {
  model,
  inputs: JSON.parse(inputs),
});
result
  .get(30000)
  .then((data) => {
    console.log(JSON.stringify(data));
    return client.disconnect();
  })
  .then(() => process.exit(0))
  .catch((error) => {
    console.error(error);
    process.exit(1);
  });
