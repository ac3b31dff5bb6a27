"""The methods' own client code, reproduced for contract tests (tests/backends/test_service_contracts.py,
tests/unit/test_retrieval_service.py): request building and response handling line for line, with
`requests` as they use it. Sources:

- Search-R1  search_r1/llm_agent/generation.py (PeterGriffinJin/Search-R1): batch_search,
  _batch_search, _passages2string.
- RAG-R1     RAG-R1/rag_r1/llm_agent/generation_mq.py (inclusionAI/AWorld-RL): batch_search
  (split on ",", strip, drop empties; one request per <search>), _passages2string (JSON).
- KG-R1      kg_r1/llm_agent/generation.py (Jinyeop3110/KG-R1): _batch_search (payload fields,
  "webqsp" fallback, relation only when non-empty, raise_for_status), _passages2string (the
  kg_retrieval branch), _get_available_actions_from_server; kg_r1/search/actions.py:
  kg_retrieval_completion_response, the shape of every KG-R1 server item.
"""

from __future__ import annotations

import json
import time
import uuid

import requests



class SearchR1Client:
    """search_r1/llm_agent/generation.py, LLMGenerationManager.batch_search and helpers."""

    def __init__(self, search_url: str, topk: int = 3) -> None:
        self.search_url, self.topk = search_url, topk

    def batch_search(self, queries):
        results = self._batch_search(queries)["result"]
        return [self._passages2string(result) for result in results]

    def _batch_search(self, queries):
        payload = {"queries": queries, "topk": self.topk, "return_scores": True}
        return requests.post(self.search_url, json=payload).json()

    def _passages2string(self, retrieval_result):
        format_reference = ""
        for idx, doc_item in enumerate(retrieval_result):
            content = doc_item["document"]["contents"]
            title = content.split("\n")[0]
            text = "\n".join(content.split("\n")[1:])
            format_reference += f"Doc {idx+1}(Title: {title}) {text}\n"
        return format_reference


class RagR1Client(SearchR1Client):
    """RAG-R1/rag_r1/llm_agent/generation_mq.py, multi-query batch_search (without its tokenizer
    truncation of each documents string to max_obs_length)."""

    def batch_search(self, queries):
        results = []
        for tmp_query in queries:
            query_list = [query.strip() for query in tmp_query.split(",")]
            query_list = [query for query in query_list if query != ""]
            result = self._batch_search(query_list)["result"]
            results.append(self._rag_passages2string(query_list, result))
        return results

    def _rag_passages2string(self, query_list, results):
        retrieval_result = {}
        document_list = []
        for documents in results:
            format_reference = ""
            for idx, doc_item in enumerate(documents):
                content = doc_item["document"]["contents"]
                format_reference += f"Doc {idx + 1}: {content}\n"
                if idx + 1 >= self.topk:
                    break
            document_list.append(format_reference.strip())
        retrieval_result["query"] = query_list
        retrieval_result["documents"] = document_list
        return json.dumps(retrieval_result, indent=2)


class KGR1Client:
    """kg_r1/llm_agent/generation.py: the request and response handling of `_batch_search`
    (parsing of the model's text is KG-R1's regexes there; here queries come already split)."""

    def __init__(self, search_url: str) -> None:
        self.search_url = search_url

    def batch_search(self, queries, meta_info_list):
        parsed_requests = []
        for i, (action_type, entity_id, relation_name) in enumerate(queries):
            meta_info = meta_info_list[i] if i < len(meta_info_list) else {"sample_id": "unknown", "dataset_name": "webqsp"}
            sample_id = meta_info.get("sample_id", "unknown_sample_id")
            dataset_name = meta_info.get("dataset_name", "webqsp")
            request_payload = {"sample_id": sample_id, "dataset_name": dataset_name, "action_type": action_type,
                               "entity_id": entity_id.strip()}
            if relation_name and relation_name.strip():
                request_payload["relation"] = relation_name.strip()
            parsed_requests.append(request_payload)
        if not parsed_requests:
            return [], []
        response = requests.post(self.search_url, json=parsed_requests, timeout=120,
                                 headers={"Content-Type": "application/json"})
        response.raise_for_status()
        server_responses = response.json()
        final_responses = []
        for idx, req in enumerate(parsed_requests):
            response = server_responses[idx].copy()
            response["request_payload"] = req
            if "kg_metadata" not in response:
                response["kg_metadata"] = {"success": response.get("success", True),
                                           "error_type": response.get("error_type", "KG_SUCCESS")}
            final_responses.append(response)
        return final_responses, [self._passages2string(item) for item in final_responses]

    def _passages2string(self, kg_server_response_item):
        if not isinstance(kg_server_response_item, dict):
            return f"Error: Unexpected KG server response format: {type(kg_server_response_item)}"
        if "object" in kg_server_response_item and kg_server_response_item.get("object") == "kg_retrieval":
            if not kg_server_response_item.get("success", False):
                if "choices" in kg_server_response_item and kg_server_response_item["choices"]:
                    return kg_server_response_item["choices"][0].get("message", {}).get("content", "Unknown error")
                return "Unknown error occurred. Please check your search format."
            if "choices" in kg_server_response_item and kg_server_response_item["choices"]:
                return kg_server_response_item["choices"][0].get("message", {}).get("content", "No content")
            return "No content in KG server response"
        if "error" in kg_server_response_item:
            return kg_server_response_item["error"]
        results = kg_server_response_item.get("results")
        if not results or not isinstance(results, list):
            return "No results found for your search query."
        return f"Retrieved data: {json.dumps(results[0])}"  # (their old-format branch, abridged)

    def available_actions(self):
        response = requests.get(f"{self.search_url.rstrip('/retrieve')}/actions")
        return response.json().get("actions", []) if response.status_code == 200 else []


def kg_retrieval_completion_response(content, action_type, is_error=False, error_type=None):
    """kg_r1/search/actions.py: the shape every KG-R1 server item has."""
    if not is_error and error_type is None:
        error_type = "KG_SUCCESS"
    return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "kg_retrieval", "created": int(time.time()),
            "model": "kg-retrieval", "success": not is_error, "action": action_type,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "logprobs": None,
                         "finish_reason": "stop" if not is_error else "error"}],
            "usage": {}, "system_fingerprint": "",
            "kg_metadata": {"action_type": action_type, "success": not is_error, "error_type": error_type,
                            "timestamp": time.time()}}
