document.getElementById("app").textContent =
  "This paddock was built without the console's scripts: build it with `make build` (it needs node and npm).";
