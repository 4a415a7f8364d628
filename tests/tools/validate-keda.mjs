// Validates the KEDA objects given as a JSON list on stdin against KEDA's CRD schemas
// (@kubernetes-models/keda); prints one line per invalid object and exits 1 if any.
import { ScaledObject } from "@kubernetes-models/keda/keda.sh/v1alpha1/ScaledObject";

const KINDS = { ScaledObject };
const input = await new Promise((resolve) => {
  let text = "";
  process.stdin.on("data", (chunk) => (text += chunk));
  process.stdin.on("end", () => resolve(text));
});
let failed = 0;
for (const object of JSON.parse(input)) {
  const Model = KINDS[object.kind];
  try {
    if (!Model) throw new Error(`no schema for ${object.apiVersion} ${object.kind}`);
    new Model(object).validate();
  } catch (error) {
    failed += 1;
    console.log(`${object.kind}/${object.metadata?.name}: ${error.message}`);
  }
}
process.exit(failed ? 1 : 0);
